"""The observability hooks: loop pass reporting through ``every``, the metrics endpoint, the trace link setting."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sundial_api.models.executions import render_execution
from sundial_common.observability.metrics import REGISTRY, pass_counts
from sundial_common.observability.probes import serve_probes
from sundial_common.runtime.service import every
from sundial_common.runtime.settings import CommonSettings
from sundial_common.security.encryption import TenantCipher


@dataclass(frozen=True)
class PassResult:
    republished: int = 0
    lost: int = 0
    healthy: bool = True  # a flag, not a count


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_pass_counts_are_the_int_fields_of_a_result() -> None:
    assert pass_counts(PassResult(republished=3, lost=1)) == {"republished": 3, "lost": 1}
    assert pass_counts(7) == {"items": 7}
    assert pass_counts({"claimed": 2, "ok": True}) == {"claimed": 2}
    assert pass_counts(None) == pass_counts(True) == {}


async def test_every_records_each_named_loop_pass_its_counts_and_errors() -> None:
    stop = asyncio.Event()
    passes = 0

    async def run_once() -> PassResult:
        nonlocal passes
        passes += 1
        if passes == 2:
            raise RuntimeError("Postgres went away")
        if passes == 4:
            stop.set()
        return PassResult(republished=2, lost=passes)

    before = {
        "passes": sample("sundial_loop_passes_total", loop="unit-sweep"),
        "errors": sample("sundial_loop_pass_errors_total", loop="unit-sweep"),
        "republished": sample("sundial_loop_items_total", loop="unit-sweep", item="republished"),
        "lost": sample("sundial_loop_items_total", loop="unit-sweep", item="lost"),
        "timed": sample("sundial_loop_pass_duration_seconds_count", loop="unit-sweep"),
    }
    # The failed pass waits max(interval, 1 s) before the next: bounded, and the loop must survive it.
    await asyncio.wait_for(every(stop, 0, run_once, name="unit-sweep"), timeout=10)

    assert sample("sundial_loop_passes_total", loop="unit-sweep") - before["passes"] == 3
    assert sample("sundial_loop_pass_errors_total", loop="unit-sweep") - before["errors"] == 1
    assert sample("sundial_loop_items_total", loop="unit-sweep", item="republished") - before["republished"] == 6
    assert sample("sundial_loop_items_total", loop="unit-sweep", item="lost") - before["lost"] == 1 + 3 + 4
    assert sample("sundial_loop_pass_duration_seconds_count", loop="unit-sweep") - before["timed"] == 4
    assert REGISTRY.get_sample_value("sundial_loop_items_total", {"loop": "unit-sweep", "item": "healthy"}) is None


async def test_the_metrics_endpoint_answers_with_loop_pass_counts() -> None:
    stop = asyncio.Event()
    passes = 0

    async def run_once() -> int:
        nonlocal passes
        passes += 1
        if passes == 3:
            stop.set()
        return 5

    await every(stop, 0, run_once, name="unit-hydrate")
    with serve_probes(0) as port:
        response = await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/metrics", timeout=5)

    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    passes_seen = [s.value for s in families["sundial_loop_passes"].samples if s.labels.get("loop") == "unit-hydrate"]
    items_seen = [s.value for s in families["sundial_loop_items"].samples if s.labels.get("loop") == "unit-hydrate"]
    assert passes_seen == [3.0] and items_seen == [15.0]
    assert "process_cpu_seconds" in families  # the process collector rides along


def test_a_trace_link_needs_an_exporter_and_a_template() -> None:
    assert CommonSettings().trace_link is None  # the local stack exports nowhere: no link to a missing Jaeger
    exporting = CommonSettings(otlp_endpoint="http://collector:4318/v1/traces")
    assert exporting.trace_link == "http://127.0.0.1:16686/trace/{trace_id}"
    assert CommonSettings(otlp_endpoint="http://collector:4318/v1/traces", trace_link_template="").trace_link is None


def test_an_execution_without_a_trace_backend_keeps_its_trace_id_and_has_no_link() -> None:
    row = {
        "id": "e",
        "job_id": "j",
        **dict.fromkeys(
            (
                "scheduled_for fire_at triggered cancel_requested_at state attempt max_attempts shard fence_token "
                "pool handler priority worker_id created_at published_at started_at finished_at result error"
            ).split()
        ),
        "trace_id": "ab" * 16,
    }

    view = render_execution(row, None, TenantCipher("acme", bytes(32)))

    assert (view["traceId"], view["traceLink"]) == ("ab" * 16, None)
