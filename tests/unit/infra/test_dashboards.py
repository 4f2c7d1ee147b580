"""The Grafana dashboards: committed JSON is the generator's output, every dashboard is well formed, every metric a
panel reads is exported, and a panel counting events says 0 rather than nothing."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
from sundial_common.observability.metrics import REGISTRY
from sundial_infra import dashboards
from sundial_infra.dashboards import (
    DASHBOARDS,
    DASHBOARDS_DIR,
    TENANT_DASHBOARD,
    ZERO_FALLBACK,
    build,
    problems,
    render,
    targets,
)

PROVISIONING = DASHBOARDS_DIR.parent / "provisioning"


def test_the_committed_dashboards_are_what_the_generator_renders() -> None:
    expected = dict(dashboards.rendered())
    committed = {p.name: p.read_text() for p in DASHBOARDS_DIR.glob("*.json")}
    assert committed.keys() == expected.keys()
    stale = [name for name in expected if committed[name] != expected[name]]
    assert not stale, f"regenerate with `.venv/bin/sundial dashboards render`: {stale} differ"


@pytest.mark.parametrize("spec", DASHBOARDS, ids=lambda s: s.uid)
def test_unique_panel_ids_provisioned_datasource_only_and_no_undefined_variable(spec: dashboards.DashboardSpec) -> None:
    model = build(spec)
    assert problems(model) == []
    assert len(list(targets(model))) >= len(spec.panels)


def test_the_checks_catch_a_duplicate_id_a_foreign_datasource_and_an_undefined_variable() -> None:
    model = build(DASHBOARDS[0])
    model["panels"][1]["id"] = model["panels"][0]["id"]
    model["panels"][2]["datasource"] = {"type": "prometheus", "uid": "other"}
    model["panels"][3]["targets"][0]["expr"] += " + $pool"
    found = "\n".join(problems(model))
    assert "not unique" in found and "uid other" not in found and "'other'" in found and "$pool" in found


def test_the_datasource_is_provisioned_with_the_uid_the_dashboards_use() -> None:
    text = (PROVISIONING / "datasources" / "prometheus.yml").read_text()
    assert f"uid: {dashboards.DATASOURCE_UID}" in text


def test_a_tenant_dashboard_has_the_tenant_fixed_in_every_query_and_no_variable(tmp_path: Path) -> None:
    written = render(tmp_path, "acme")
    assert sorted(p.name for p in written) == ["tenant-acme.json", "tenant.json"]
    fixed = json.loads((tmp_path / "tenant-acme.json").read_text())
    operator = json.loads((tmp_path / "tenant.json").read_text())
    assert fixed["templating"].get("list", []) == []
    assert fixed["uid"] != operator["uid"]
    exprs = [expr for _, expr in targets(fixed)]
    assert exprs and all('tenant="acme"' in e and "$tenant" not in e for e in exprs)
    assert all('tenant="$tenant"' in e for _, e in targets(operator))
    assert [v["name"] for v in operator["templating"]["list"]] == ["tenant"]
    assert operator == build(TENANT_DASHBOARD)


@pytest.mark.parametrize("bad", ['acme"}', "", "a b", "-x", "x" * 64])
def test_render_refuses_what_is_not_a_tenant_id(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a tenant id"):
        render(tmp_path, bad)


#: Series Prometheus makes itself, not a process's registry.
PROMETHEUS_SERIES = {"up"}
_METRIC = re.compile(r"\b(sundial_[a-z0-9_]+|process_[a-z0-9_]+|up)\b(?!\s*\()")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _registered() -> set[str]:
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES)
    return names


@pytest.mark.parametrize("spec", DASHBOARDS, ids=lambda s: s.uid)
def test_every_metric_a_panel_reads_is_in_the_registry(spec: dashboards.DashboardSpec) -> None:
    # A fallback to 0 must never hide a misspelt metric: what a query names is what the processes export.
    importlib.import_module("sundial_api.metrics")  # the API's own request metrics register on import
    importlib.import_module("sundial_gateway.telemetry")  # and the worker gateway's
    registered = _registered() | PROMETHEUS_SERIES
    for title, expr in targets(build(spec)):
        named = set(_METRIC.findall(expr))
        assert named, f"{title}: {expr} reads no metric"
        assert named <= registered, f"{title}: {sorted(named - registered)} are not in the registry"


@pytest.mark.parametrize("spec", DASHBOARDS, ids=lambda s: s.uid)
def test_every_panel_that_counts_events_says_0_rather_than_nothing(spec: dashboards.DashboardSpec) -> None:
    counting = [(t, e) for t, e in targets(build(spec)) if dashboards.counts_events(e.removesuffix(ZERO_FALLBACK))]
    assert all(e.endswith(ZERO_FALLBACK) for _, e in counting), counting
    assert all(
        not e.endswith(ZERO_FALLBACK) for _, e in targets(build(spec)) if "histogram_quantile" in e
    )  # a quantile of nothing is not 0


def test_missed_fires_fall_back_to_0() -> None:
    exprs = {title: expr for spec in DASHBOARDS for title, expr in targets(build(spec))}
    for title in ("Missed fires", "Missed fires by tenant"):
        assert exprs[title].endswith(" or on() vector(0)"), exprs[title]
