"""The Kubernetes manifests render with kustomize, every object is valid against the Kubernetes schemas, and
each process is deployed the way the operations guide promises: probes on its real endpoints, requests, a
disruption budget, a wait for the schema, secrets by reference only, images pinned by tag."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from sundial_infra.kubernetes import stale

ROOT = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production")
#: Custom resources whose schemas the validator does not carry (the Prometheus Operator's).
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
PROBE_PATHS = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
SECRET_VARIABLES = {"SUNDIAL_DATABASE_URL", "SUNDIAL_JWT_SECRET", "SUNDIAL_MASTER_KEY"}


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is needed to render the manifests (`kubectl kustomize` needs no cluster)"
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "overlays" / overlay)], capture_output=True, text=True, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def test_every_object_is_valid_for_kubernetes(objects: list[dict[str, Any]]) -> None:
    skipped = set()
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            skipped.add(obj["kind"])
            continue
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    assert skipped == {kind for _api, kind in CUSTOM_KINDS}  # present, and only these go unchecked


def test_each_process_probes_its_real_endpoints_and_requests_resources(objects: list[dict[str, Any]]) -> None:
    assert {w["metadata"]["name"] for w in workloads(objects)} == {
        "sundial-api",
        "sundial-gateway",
        "sundial-dispatcher",
        "sundial-services",
        "sundial-worker-demo",
        "sundial-analytics",
    }
    for workload in workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        [container] = pod["containers"]
        ports = {p["name"] for p in container["ports"]}
        for probe, path in PROBE_PATHS.items():
            get = container[probe]["httpGet"]
            assert (get["path"], get["port"] in ports) == (path, True), (workload["metadata"]["name"], probe)
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), workload["metadata"]["name"]
        assert [c["args"][:2] for c in pod["initContainers"]] == [["migrate", "--wait"]]


def test_each_process_has_a_disruption_budget(objects: list[dict[str, Any]]) -> None:
    budgets = [o["spec"]["selector"]["matchLabels"] for o in objects if o["kind"] == "PodDisruptionBudget"]
    for workload in workloads(objects):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert any(b.items() <= labels.items() for b in budgets), workload["metadata"]["name"]


def test_no_secret_value_is_rendered_and_images_are_pinned(objects: list[dict[str, Any]]) -> None:
    assert not [o for o in objects if o["kind"] == "Secret"]
    pods = [w["spec"]["template"]["spec"] for w in workloads(objects)]
    pods += [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Job"]
    for pod in pods:
        for container in pod["containers"] + pod.get("initContainers", []):
            image = container["image"]
            assert ":" in image and not image.endswith(":latest"), image
            for variable in container.get("env", []):
                if variable["name"] in SECRET_VARIABLES:
                    assert "value" not in variable and "secretKeyRef" in variable["valueFrom"], variable
    for config in (o for o in objects if o["kind"] == "ConfigMap"):
        assert not SECRET_VARIABLES & set(config.get("data", {})), config["metadata"]["name"]


def test_the_workers_finish_running_handlers_before_they_are_killed(objects: list[dict[str, Any]]) -> None:
    [worker] = [w for w in workloads(objects) if w["metadata"]["name"] == "sundial-worker-demo"]
    pod = worker["spec"]["template"]["spec"]
    env = {v["name"]: v.get("value") for v in pod["containers"][0]["env"]}
    assert pod["terminationGracePeriodSeconds"] > float(env["SUNDIAL_WORKER_SHUTDOWN_GRACE_SEC"])


def test_the_generated_monitoring_manifests_are_current() -> None:
    assert stale() == [], "run: python -m sundial_infra.kubernetes"
