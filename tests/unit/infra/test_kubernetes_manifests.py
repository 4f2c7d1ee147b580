"""The Kubernetes manifests render with kustomize, every object is valid against the Kubernetes schemas (the
custom resources against their CRDs' schemas, vendored), and each process is deployed the way the operations
guide promises: probes on its real endpoints, requests, a disruption budget, a wait for the schema, secrets by
reference only, images pinned by tag, workers scaled on their pool's consumer lag by one autoscaler."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from sundial_common.observability.metrics import CONSUMER_LAG
from sundial_infra.crd_schemas import validator, vendored
from sundial_infra.kubernetes import stale

ROOT = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production")
#: Custom resources each overlay renders, checked against their vendored CRD schemas (kubernetes-validate
#: knows Kubernetes' own kinds only).
CUSTOM_KINDS = {
    "dev": {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")},
    "production": {
        ("monitoring.coreos.com/v1", "PodMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("keda.sh/v1alpha1", "ScaledObject"),
    },
}
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
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def objects(overlay: str) -> list[dict[str, Any]]:
    return render(overlay)


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def test_every_object_is_valid_for_kubernetes(overlay: str, objects: list[dict[str, Any]]) -> None:
    custom = set()
    for obj in objects:
        kind = (obj["apiVersion"], obj["kind"])
        if kind in vendored():
            custom.add(kind)
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(*kind).iter_errors(obj)]
            assert errors == [], (obj["kind"], obj["metadata"]["name"])
        else:
            kubernetes_validate.validate(obj, "1.30.0", strict=True)
    assert custom == CUSTOM_KINDS[overlay]


@pytest.mark.parametrize(
    ("path", "wrong", "complaint"),
    [
        (("spec", "minReplicas"), 2, "Additional properties are not allowed ('minReplicas' was unexpected)"),
        (("spec", "pollingInterval"), "15s", "'15s' is not of type 'integer'"),
        (("spec", "scaleTargetRef", "name"), None, "'name' is a required property"),
    ],
)
def test_a_mistake_in_a_custom_resource_is_caught(path: tuple[str, ...], wrong: object, complaint: str) -> None:
    [scaled] = [o for o in render("production") if o["kind"] == "ScaledObject"]
    *parents, leaf = path
    node = scaled
    for key in parents:
        node = node[key]
    if wrong is None:
        del node[leaf]
    else:
        node[leaf] = wrong
    assert [e.message for e in validator(scaled["apiVersion"], scaled["kind"]).iter_errors(scaled)] == [complaint]


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


def test_each_worker_pool_scales_on_its_consumer_lag_by_one_autoscaler(
    overlay: str, objects: list[dict[str, Any]]
) -> None:
    [lag] = [metric.name for metric in CONSUMER_LAG.describe()]
    for worker in (w for w in workloads(objects) if w["metadata"]["name"].startswith("sundial-worker-")):
        name = worker["metadata"]["name"]
        pool = worker["spec"]["template"]["metadata"]["labels"]["sundial.io/pool"]
        hpas = [
            o for o in objects if o["kind"] == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] == name
        ]
        keda = [o for o in objects if o["kind"] == "ScaledObject" and o["spec"]["scaleTargetRef"]["name"] == name]
        assert len(hpas) + len(keda) == 1, (overlay, name)  # two autoscalers on one Deployment fight
        if overlay == "production":  # KEDA, on the lag the Prometheus Operator scrapes
            [scaled] = keda
            [trigger] = scaled["spec"]["triggers"]
            assert trigger["type"] == "prometheus"
            assert lag in trigger["metadata"]["query"] and f'pool="{pool}"' in trigger["metadata"]["query"]
            assert scaled["spec"]["minReplicaCount"] >= 1  # a due fire finds a consumer running
        else:  # an HPA on the external metric, through an adapter
            [hpa] = hpas
            [metric] = hpa["spec"]["metrics"]
            assert metric["external"]["metric"] == {"name": lag, "selector": {"matchLabels": {"pool": pool}}}


def test_the_generated_monitoring_manifests_are_current() -> None:
    assert stale() == [], "run: python -m sundial_infra.kubernetes"
