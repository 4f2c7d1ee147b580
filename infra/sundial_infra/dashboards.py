"""Sundial's Grafana dashboards as code, and ``sundial dashboards render``.

This module owns what each dashboard shows (its panels and their PromQL, written against the metric
catalogue of ``sundial_common.observability.metrics``) and how it becomes Grafana JSON: through grafana-foundation-sdk's
builders, with every panel and query on the provisioned Prometheus datasource (:data:`DATASOURCE_UID`,
``infra/grafana/provisioning/datasources/``). The committed JSON under ``infra/grafana/dashboards/`` is
this module's output (``sundial dashboards render`` rewrites it; a test checks it is current).

Four dashboards: **Overview** (operators, every tenant), **Tenant** (one tenant; the operator copy has a
``$tenant`` variable, ``render --tenant ID`` writes a copy with the tenant fixed in every query, for that
tenant's own folder), **Workers & pools** and **Cluster**. Tenant queries say ``tenant="$tenant"``, which
is what a fixed tenant replaces.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos, VariableRefresh

#: The uid of the Prometheus datasource every dashboard uses (provisioned with this uid).
DATASOURCE_UID = "sundial-prometheus"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
#: Where the committed dashboards live.
DASHBOARDS_DIR = Path(__file__).resolve().parents[1] / "grafana" / "dashboards"
#: A tenant id as it may appear inside a PromQL string and a file name.
TENANT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

Kind = Literal["timeseries", "stat", "table"]


@dataclasses.dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: Kind = "timeseries"
    description: str = ""


#: A query counting events: a rate, increase or count of changes of a counter (not a quantile of a histogram).
_COUNTS_EVENTS = re.compile(r"\b(rate|increase|changes)\(")
#: What an event-counting query answers when no series exists yet: a single 0 ("none happened"), only then.
ZERO_FALLBACK = " or on() vector(0)"


def counts_events(expr: str) -> bool:
    """``expr`` counts events (so "none" is 0, not "No data"): a rate, increase or change count of a ``sundial_``
    counter — not a quantile, which has no value without events, nor a process's CPU rate."""
    return bool(_COUNTS_EVENTS.search(expr)) and "histogram_quantile" not in expr and "sundial_" in expr


def _p(
    title: str, *queries: tuple[str, str] | str, unit: str = "short", kind: Kind = "timeseries", help: str = ""
) -> Panel:
    """A panel. A query that counts events falls back to 0 where its series cannot exist yet (no missed fire since
    the process started, no retry …), so a viewer tells "none" from "broken"; ``on()`` keeps the 0 out whenever
    any series exists. The dashboard test checks every metric a query names is in the registry, so the fallback
    cannot hide a misspelt one."""
    qs = tuple(Query(q) if isinstance(q, str) else Query(*q) for q in queries)
    qs = tuple(dataclasses.replace(q, expr=q.expr + ZERO_FALLBACK) if counts_events(q.expr) else q for q in qs)
    return Panel(title, qs, unit, kind, help)


RI = "$__rate_interval"
T = 'tenant="$tenant"'


def _lateness(quantile: float, by: str, selector: str = "") -> str:
    return (
        f"histogram_quantile({quantile}, sum by ({by}, le) "
        f"(rate(sundial_dispatch_lateness_seconds_bucket{{{selector}}}[{RI}])))"
    )


OVERVIEW = (
    _p(
        "P95 dispatch lateness by tenant (SLO < 1 s)",
        (_lateness(0.95, "tenant"), "{{tenant}}"),
        unit="s",
        help="Handler start minus scheduled time, 95th percentile; SundialDispatchLatenessSLO fires over 1 s.",
    ),
    _p(
        "Dispatched per second by tenant",
        (f"sum by (tenant) (rate(sundial_executions_dispatched_total[{RI}]))", "{{tenant}}"),
        unit="ops",
    ),
    _p(
        "Finished per second by final state",
        (f"sum by (state) (rate(sundial_executions_finished_total[{RI}]))", "{{state}}"),
        unit="ops",
    ),
    _p(
        "Failures per second by tenant (FAILED, TIMED_OUT, DEAD)",
        (
            f'sum by (tenant) (rate(sundial_executions_finished_total{{state=~"FAILED|TIMED_OUT|DEAD"}}[{RI}]))',
            "{{tenant}}",
        ),
        unit="ops",
    ),
    _p(
        "Retries per second by tenant",
        (f"sum by (tenant) (rate(sundial_retries_total[{RI}]))", "{{tenant}}"),
        unit="ops",
    ),
    _p("Dead-letter queue size by tenant", ("max by (tenant) (sundial_dead_letter_queue_size)", "{{tenant}}")),
    _p("Jobs by state", ("sum by (state) (max by (tenant, state) (sundial_jobs))", "{{state}}")),
    _p(
        "Jobs created per second by tenant and type",
        (f"sum by (tenant, type) (rate(sundial_jobs_created_total[{RI}]))", "{{tenant}} {{type}}"),
        unit="ops",
    ),
    _p("Missed fires by tenant", (f"sum by (tenant) (increase(sundial_missed_fires_total[{RI}]))", "{{tenant}}")),
    _p(
        "API requests per second by route and status",
        (f"sum by (route, status) (rate(sundial_api_requests_total[{RI}]))", "{{route}} {{status}}"),
        unit="reqps",
    ),
    _p(
        "API P95 latency by route",
        (
            f"histogram_quantile(0.95, sum by (route, le) (rate(sundial_api_request_duration_seconds_bucket[{RI}])))",
            "{{route}}",
        ),
        unit="s",
    ),
    _p("Processes reporting by service", ("sum by (service) (up)", "{{service}}"), kind="stat"),
)

TENANT = (
    _p(
        "P95 dispatch lateness by pool (SLO < 1 s)",
        (_lateness(0.95, "pool", T), "p95 {{pool}}"),
        (_lateness(0.5, "pool", T), "p50 {{pool}}"),
        unit="s",
    ),
    _p(
        "Dispatched per second by pool",
        (f"sum by (pool) (rate(sundial_executions_dispatched_total{{{T}}}[{RI}]))", "{{pool}}"),
        unit="ops",
    ),
    _p(
        "Finished per second by final state",
        (f"sum by (state) (rate(sundial_executions_finished_total{{{T}}}[{RI}]))", "{{state}}"),
        unit="ops",
    ),
    _p(
        "Failures per second (FAILED, TIMED_OUT, DEAD)",
        (
            f'sum by (state) (rate(sundial_executions_finished_total{{{T},state=~"FAILED|TIMED_OUT|DEAD"}}[{RI}]))',
            "{{state}}",
        ),
        unit="ops",
    ),
    _p(
        "Retries per second by pool",
        (f"sum by (pool) (rate(sundial_retries_total{{{T}}}[{RI}]))", "{{pool}}"),
        unit="ops",
    ),
    _p(
        "Dead letters per second by pool",
        (f"sum by (pool) (rate(sundial_dead_letters_total{{{T}}}[{RI}]))", "{{pool}}"),
        unit="ops",
    ),
    _p("Dead-letter queue size", (f"max(sundial_dead_letter_queue_size{{{T}}})", "DLQ"), kind="stat"),
    _p(
        "Retry circuit breakers (0 closed, 1 half-open, 2 open) and retries held",
        (f"max by (pool, handler) (sundial_breaker_state{{{T}}})", "{{pool}}/{{handler}} state"),
        (f"max by (pool, handler) (sundial_breaker_held_retries{{{T}}})", "{{pool}}/{{handler}} held"),
    ),
    _p("Missed fires", (f"sum(increase(sundial_missed_fires_total{{{T}}}[{RI}]))", "missed"), kind="stat"),
    _p("Jobs by state", (f"max by (state) (sundial_jobs{{{T}}})", "{{state}}")),
    _p(
        "Slowest handlers (P95 run time)",
        (
            f"topk(5, histogram_quantile(0.95, sum by (pool, handler, le) "
            f"(rate(sundial_execution_duration_seconds_bucket{{{T}}}[{RI}]))))",
            "{{pool}}/{{handler}}",
        ),
        unit="s",
    ),
    _p(
        "Jobs created per second by type",
        (f"sum by (type) (rate(sundial_jobs_created_total{{{T}}}[{RI}]))", "{{type}}"),
        unit="ops",
    ),
)

WORKERS = (
    _p(
        "Consumer lag by pool and partition",
        ("max by (pool, partition) (sundial_consumer_lag_messages)", "{{pool}}/{{partition}}"),
    ),
    _p(
        "Consumer lag by pool", ("sum by (pool) (max by (pool, partition) (sundial_consumer_lag_messages))", "{{pool}}")
    ),
    _p(
        "Finished per second by pool and state",
        (f"sum by (pool, state) (rate(sundial_executions_finished_total[{RI}]))", "{{pool}} {{state}}"),
        unit="ops",
    ),
    _p(
        "P95 handler run time by pool and handler",
        (
            "histogram_quantile(0.95, sum by (pool, handler, le) "
            f"(rate(sundial_execution_duration_seconds_bucket[{RI}])))",
            "{{pool}}/{{handler}}",
        ),
        unit="s",
    ),
    _p("P95 dispatch lateness by pool", (_lateness(0.95, "pool"), "{{pool}}"), unit="s"),
    # The worker's loops (admission, execution, heartbeats, outcomes, commits) are not driven by every(), so
    # they have no sundial_loop_* series; what a worker does shows in the execution metrics above.
    _p(
        "Dispatched per second by pool",
        (f"sum by (pool) (rate(sundial_executions_dispatched_total[{RI}]))", "{{pool}}"),
        unit="ops",
    ),
    _p(
        "Worker CPU",
        (f'rate(process_cpu_seconds_total{{service="worker"}}[{RI}])', "{{instance}}"),
        unit="percentunit",
    ),
    _p("Workers up", ('up{service="worker"}', "{{instance}}"), kind="stat"),
    _p("Worker resident memory", ('process_resident_memory_bytes{service="worker"}', "{{instance}}"), unit="bytes"),
    # Workers that run through the worker gateway (pool tokens): what they asked of it and what it answered. Counters
    # only (they read 0 where no gateway runs, as the dashboards' proof requires); the pull wait and the open long
    # polls are in the metrics reference.
    _p(
        "Gateway: executions handed out and finishes per second by pool",
        (f"sum by (pool) (rate(sundial_gateway_executions_leased_total[{RI}]))", "{{pool}} handed out"),
        (f"sum by (pool, answer) (rate(sundial_gateway_finishes_total[{RI}]))", "{{pool}} finish {{answer}}"),
        unit="ops",
    ),
    _p(
        "Gateway: pulls and heartbeats per second by pool",
        (f"sum by (pool, outcome) (rate(sundial_gateway_pulls_total[{RI}]))", "{{pool}} pull {{outcome}}"),
        (f"sum by (pool, answer) (rate(sundial_gateway_heartbeats_total[{RI}]))", "{{pool}} heartbeat {{answer}}"),
        unit="ops",
    ),
)

CLUSTER = (
    _p(
        "Shard leaders",
        ("sundial_shard_leader == 1", "shard {{shard}}: {{replica}}"),
        kind="table",
        help="Which dispatcher replica leads each shard; SundialShardWithoutLeader fires when a shard has none.",
    ),
    _p("Fence token per shard", ("max by (shard) (sundial_shard_fence_token)", "shard {{shard}}")),
    _p(
        "Failovers (fence token changes)",
        (f"sum by (shard) (changes(sundial_shard_fence_token[{RI}]))", "shard {{shard}}"),
    ),
    _p("Hot-window members per shard", ("max by (shard) (sundial_hot_window_members)", "shard {{shard}}")),
    _p(
        "Oldest overdue member of the hot window",
        ("max by (shard) (sundial_hot_window_oldest_due_age_seconds)", "shard {{shard}}"),
        unit="s",
    ),
    _p(
        "P95 dispatch batch size per shard",
        (
            f"histogram_quantile(0.95, sum by (shard, le) (rate(sundial_dispatch_batch_size_bucket[{RI}])))",
            "shard {{shard}}",
        ),
    ),
    _p(
        "P95 dispatch pass duration per shard",
        (
            f"histogram_quantile(0.95, sum by (shard, le) (rate(sundial_dispatch_pass_duration_seconds_bucket[{RI}])))",
            "shard {{shard}}",
        ),
        unit="s",
    ),
    _p(
        "Sweeper recoveries per second by reason",
        (f"sum by (reason) (rate(sundial_sweeper_recoveries_total[{RI}]))", "{{reason}}"),
        unit="ops",
    ),
    _p(
        "Loop pass errors per second by service",
        (f"sum by (service, loop) (rate(sundial_loop_pass_errors_total[{RI}]))", "{{service}} {{loop}}"),
        unit="ops",
    ),
    _p("Processes up", ("up", "{{service}} {{instance}}"), kind="stat"),
)


@dataclasses.dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = ("sundial",)
    description: str = ""

    @property
    def uses_tenant(self) -> bool:
        return any("$tenant" in q.expr for p in self.panels for q in p.queries)

    def for_tenant(self, tenant: str) -> DashboardSpec:
        """This dashboard with ``tenant`` fixed in every query: no variable a viewer could change."""
        check_tenant(tenant)
        panels = tuple(
            dataclasses.replace(
                p, queries=tuple(dataclasses.replace(q, expr=q.expr.replace("$tenant", tenant)) for q in p.queries)
            )
            for p in self.panels
        )
        return dataclasses.replace(
            self, uid=f"{self.uid}-{tenant}"[:40], title=f"{self.title}: {tenant}", panels=panels
        )


DASHBOARDS = (
    DashboardSpec(
        "sundial-overview",
        "Sundial / Overview",
        OVERVIEW,
        description="Every tenant: lateness, throughput, failures, API.",
    ),
    DashboardSpec("sundial-tenant", "Sundial / Tenant", TENANT, description="One tenant's jobs and executions."),
    DashboardSpec(
        "sundial-workers", "Sundial / Workers & pools", WORKERS, description="Consumer lag, handlers, worker loops."
    ),
    DashboardSpec(
        "sundial-cluster",
        "Sundial / Cluster",
        CLUSTER,
        description="Shards, leaders, fence tokens, hot window, failovers.",
    ),
)
TENANT_DASHBOARD = DASHBOARDS[1]


def check_tenant(tenant: str) -> None:
    if not TENANT_ID.match(tenant):
        raise ValueError(f"tenant {tenant!r} is not a tenant id (letters, digits, '_', '.', '-'; at most 63)")


def _panel(panel: Panel, panel_id: int) -> Any:
    builder: Any
    if panel.kind == "stat":
        builder = stat.Panel()
    elif panel.kind == "table":
        builder = table.Panel()
    else:
        builder = timeseries.Panel()
    builder = (
        builder.id(panel_id)
        .title(panel.title)
        .datasource(DATASOURCE)
        .unit(panel.unit)
        .grid_pos(GridPos(h=8, w=12, x=0, y=0))
    )
    if panel.description:
        builder = builder.description(panel.description)
    for index, query in enumerate(panel.queries):
        target = prometheus.Dataquery().expr(query.expr).datasource(DATASOURCE).ref_id(chr(ord("A") + index))
        if panel.kind == "table":
            target = target.instant()
        else:
            target = target.range()
        if query.legend:
            target = target.legend_format(query.legend)
        builder = builder.with_target(target)
    return builder


def build(spec: DashboardSpec) -> dict[str, Any]:
    """The Grafana JSON model of ``spec``."""
    board = (
        gdash.Dashboard(spec.title)
        .uid(spec.uid)
        .tags(list(spec.tags))
        .description(spec.description)
        .editable()
        .time("now-1h", "now")
        .refresh("30s")
    )
    if spec.uses_tenant:
        board = board.with_variable(
            gdash.QueryVariable("tenant")
            .label("Tenant")
            .datasource(DATASOURCE)
            .query("label_values(sundial_jobs, tenant)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
    for panel_id, panel in enumerate(spec.panels, start=1):
        board = board.with_panel(_panel(panel, panel_id))
    model: dict[str, Any] = _without_nulls(json.loads(json.dumps(board.build(), cls=JSONEncoder)))
    return model


def _without_nulls(node: Any) -> Any:
    """The SDK writes unset fields as null (``"options": null``); Grafana wants them absent (its defaults)."""
    if isinstance(node, dict):
        return {k: _without_nulls(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_without_nulls(v) for v in node]
    return node


def dumps(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def rendered() -> Iterator[tuple[str, str]]:
    """(file name, JSON) of every committed dashboard."""
    for spec in DASHBOARDS:
        yield f"{spec.uid.removeprefix('sundial-')}.json", dumps(build(spec))


# --- checks shared by the tests and `render` ----------------------------------------------------


def targets(model: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    for panel in model.get("panels", []):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}")
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


def problems(model: dict[str, Any]) -> list[str]:
    """What is wrong with a dashboard: duplicate panel ids, a foreign datasource, an undefined variable."""
    found: list[str] = []
    ids = [p.get("id") for p in model.get("panels", [])]
    if len(ids) != len(set(ids)) or None in ids:
        found.append(f"panel ids are not unique: {ids}")
    defined = {v["name"] for v in model.get("templating", {}).get("list", [])} | BUILTIN_VARIABLES

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "datasource" and (not isinstance(value, dict) or value.get("uid") != DATASOURCE_UID):
                    found.append(f"{where}: datasource {value!r} is not uid {DATASOURCE_UID}")
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")
        elif isinstance(node, str):
            for match in _VARIABLE.finditer(node):
                name = match.group(1) or match.group(2)
                if name not in defined:
                    found.append(f"{where}: undefined variable ${name}")

    walk(model, model.get("uid", "?"))
    for panel in model.get("panels", []):
        if not panel.get("targets"):
            found.append(f"panel {panel.get('title')!r} has no query")
    return found


# --- the command --------------------------------------------------------------------------------


def render(out: Path, tenant: str | None = None) -> list[Path]:
    """Write the dashboards: all four, or with ``tenant`` its Tenant dashboard beside the operator copy."""
    out.mkdir(parents=True, exist_ok=True)
    files: list[tuple[str, dict[str, Any]]]
    if tenant is None:
        files = [(f"{spec.uid.removeprefix('sundial-')}.json", build(spec)) for spec in DASHBOARDS]
    else:
        files = [
            (f"tenant-{tenant}.json", build(TENANT_DASHBOARD.for_tenant(tenant))),
            ("tenant.json", build(TENANT_DASHBOARD)),
        ]
    written = []
    for name, model in files:
        if errors := problems(model):
            raise ValueError(f"{name}: " + "; ".join(errors))
        path = out / name
        path.write_text(dumps(model))
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Grafana dashboards as code: `sundial dashboards render [--tenant ID] [--out DIR]`."""
    parser = argparse.ArgumentParser(prog="sundial dashboards", description="Sundial's Grafana dashboards as code.")
    sub = parser.add_subparsers(dest="command", required=True)
    render_cmd = sub.add_parser(
        "render",
        help="write dashboard JSON",
        description="Without --tenant: the four dashboards (default: into infra/grafana/dashboards). With --tenant: "
        "that tenant's Tenant dashboard, the tenant fixed in every query (tenant-ID.json), beside the operator copy "
        "with a $tenant variable (tenant.json).",
    )
    render_cmd.add_argument("--tenant", help="tenant id to fix in every query")
    render_cmd.add_argument(
        "--out",
        type=Path,
        help="output directory (default: infra/grafana/dashboards, or infra/grafana/tenants with --tenant)",
    )
    args = parser.parse_args(argv)
    out = args.out or (DASHBOARDS_DIR if args.tenant is None else DASHBOARDS_DIR.parent / "tenants")
    try:
        written = render(out, args.tenant)
    except ValueError as exc:
        print(f"sundial dashboards render: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
