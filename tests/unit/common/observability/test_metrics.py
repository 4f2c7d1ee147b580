"""The metric catalogue's recording helpers: label children bound once, bounded handler labels, ended attempts
counted alike everywhere, shard gauges, and ``/metrics`` answering OpenMetrics to a scraper that asks for it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from unittest import mock

import httpx
import pytest
from prometheus_client import Counter
from sundial_common.observability.metrics import (
    EXECUTIONS_FINISHED,
    REGISTRY,
    AttemptsEnded,
    Children,
    exposition,
)
from sundial_common.observability.probes import serve_probes
from sundial_dispatcher.cli import main as dispatcher_main
from sundial_dispatcher.metrics import Leadership, ShardPassMetrics, count_dispatched
from sundial_hydrator.cli import main as hydrator_main
from sundial_sweeper.cli import main as sweeper_main
from sundial_worker.cli import main as worker_main
from sundial_worker.metrics import OTHER_HANDLER, ExecutionMetrics, LagGauge
from sundial_worker.sdk import Context

from tests.support.openmetrics import metric_families

OPENMETRICS = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"


def value(name: str, **labels: str) -> float:
    found = REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_children_bind_each_label_tuple_once_and_forget_removes_series() -> None:
    tenant = unique("t")
    children: Children[Counter] = Children(EXECUTIONS_FINISHED)
    with mock.patch.object(EXECUTIONS_FINISHED, "labels", wraps=EXECUTIONS_FINISHED.labels) as labels:
        first = children(tenant, "p", "SUCCEEDED")
        for _ in range(100):
            assert children(tenant, "p", "SUCCEEDED") is first
        children(tenant, "p", "DEAD")
    assert labels.call_count == 2  # one per distinct tuple, however many recordings

    first.inc(3)
    children.forget(keep=[(tenant, "p", "SUCCEEDED")])
    assert value("sundial_executions_finished_total", tenant=tenant, pool="p", state="SUCCEEDED") == 3
    assert (
        REGISTRY.get_sample_value("sundial_executions_finished_total", {"tenant": tenant, "pool": "p", "state": "DEAD"})
        is None
    )
    children.forget()
    assert (
        REGISTRY.get_sample_value(
            "sundial_executions_finished_total", {"tenant": tenant, "pool": "p", "state": "SUCCEEDED"}
        )
        is None
    )


def test_ended_attempts_count_retries_finished_states_and_dead_letters_per_tenant() -> None:
    a, b = unique("a"), unique("b")
    AttemptsEnded().record(
        [
            (a, "p", "SUCCEEDED", False),
            (a, "p", "SUCCEEDED", False),
            (a, "p", "FAILED", True),  # a retry was scheduled: not finished
            (a, "p", "DEAD", False),
            (b, "p", "CANCELLED", False),
        ]
    )
    assert value("sundial_executions_finished_total", tenant=a, pool="p", state="SUCCEEDED") == 2
    assert value("sundial_executions_finished_total", tenant=a, pool="p", state="FAILED") == 0
    assert value("sundial_retries_total", tenant=a, pool="p") == 1
    assert value("sundial_dead_letters_total", tenant=a, pool="p") == 1
    assert value("sundial_executions_finished_total", tenant=b, pool="p", state="CANCELLED") == 1
    assert value("sundial_dead_letters_total", tenant=b, pool="p") == 0


def context(tenant: str, handler: str, attempt: int, trace_id: str | None) -> Context:
    return Context(
        execution_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        tenant=tenant,
        attempt=attempt,
        fence_token=1,
        scheduled_for=datetime.now(UTC) - timedelta(seconds=10),
        handler=handler,
        pool="p",
        trace_id=trace_id,
        logger=mock.Mock(),
        previous_progress=None,
        _sink=mock.Mock(),
    )


async def test_a_handler_the_worker_does_not_declare_is_labelled_other() -> None:
    tenant = unique("t")
    metrics = ExecutionMetrics("p", frozenset({"echo"}))
    assert metrics.handler_label("echo") == "echo"
    assert metrics.handler_label(f"typo-{uuid.uuid4().hex}") == OTHER_HANDLER

    work: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    metrics.handler_started(context(tenant, "echo", 1, "ab" * 16), datetime.now(UTC) - timedelta(seconds=2), work)
    metrics.handler_started(context(tenant, "whatever-a-job-says", 1, None), None, None)
    assert value("sundial_execution_duration_seconds_count", tenant=tenant, pool="p", handler="echo") == 0
    work.set_result(None)
    await asyncio.sleep(0)  # the done callback runs on the loop
    assert value("sundial_execution_duration_seconds_count", tenant=tenant, pool="p", handler="echo") == 1
    assert value("sundial_execution_duration_seconds_count", tenant=tenant, pool="p", handler="other") == 1
    assert (
        value("sundial_execution_duration_seconds_count", tenant=tenant, pool="p", handler="whatever-a-job-says") == 0
    )
    # Lateness: from the due time when known (2 s), else the nominal time (10 s); first attempts only.
    assert 12 <= value("sundial_dispatch_lateness_seconds_sum", tenant=tenant, pool="p") < 14
    metrics.handler_started(context(tenant, "echo", 2, None), None, None)
    assert value("sundial_dispatch_lateness_seconds_count", tenant=tenant, pool="p") == 2

    body, _ = exposition(OPENMETRICS)
    exemplars = [
        s.exemplar.labels
        for family in metric_families(body.decode())
        if family.name == "sundial_dispatch_lateness_seconds"
        for s in family.samples
        if s.labels.get("tenant") == tenant and s.exemplar is not None
    ]
    assert exemplars == [{"trace_id": "ab" * 16}]


def test_a_slow_lateness_bucket_gets_its_own_exemplar_after_a_fast_one() -> None:
    # Exemplars are kept per bucket: a burst of fast starts must not stop a slow one linking to its trace.
    tenant = unique("t")
    metrics = ExecutionMetrics("p", frozenset({"echo"}))
    now = datetime.now(UTC)
    metrics.handler_started(context(tenant, "echo", 1, "aa" * 16), now + timedelta(hours=1), None)  # 0 s late
    metrics.handler_started(context(tenant, "echo", 1, "bb" * 16), now - timedelta(seconds=20), None)  # ~20 s

    body, _ = exposition(OPENMETRICS)
    exemplars = {
        s.labels["le"]: s.exemplar.labels["trace_id"]
        for family in metric_families(body.decode())
        if family.name == "sundial_dispatch_lateness_seconds"
        for s in family.samples
        if s.labels.get("tenant") == tenant and s.exemplar is not None
    }
    assert exemplars == {"0.01": "aa" * 16, "30.0": "bb" * 16}


def test_lag_series_of_revoked_partitions_are_removed() -> None:
    pool = unique("p")
    gauge = LagGauge(pool)
    gauge.update({0: 5, 1: 7})
    gauge.update({1: 2})
    assert REGISTRY.get_sample_value("sundial_consumer_lag_messages", {"pool": pool, "partition": "0"}) is None
    assert value("sundial_consumer_lag_messages", pool=pool, partition="1") == 2


def test_shard_gauges_follow_leadership_and_passes() -> None:
    replica = unique("r")
    leadership = Leadership(9, replica)
    assert REGISTRY.get_sample_value("sundial_shard_leader", {"shard": "9", "replica": replica}) == 0
    leadership.leading(41)
    assert value("sundial_shard_leader", shard="9", replica=replica) == 1
    assert value("sundial_shard_fence_token", shard="9") == 41
    leadership.stepped_down()
    assert value("sundial_shard_leader", shard="9", replica=replica) == 0
    assert REGISTRY.get_sample_value("sundial_shard_fence_token", {"shard": "9"}) is None

    before = (
        value("sundial_dispatch_batch_size_count", shard="9"),
        value("sundial_dispatch_pass_duration_seconds_count", shard="9"),
    )
    metrics = ShardPassMetrics(9)
    metrics.passed(0.01, claimed=0)  # an empty pass: timed, no batch
    metrics.passed(0.02, claimed=250)
    assert value("sundial_dispatch_batch_size_count", shard="9") - before[0] == 1
    assert value("sundial_dispatch_pass_duration_seconds_count", shard="9") - before[1] == 2

    tenant = unique("t")
    count_dispatched([(tenant, "p"), (tenant, "p"), (tenant, "q")])
    assert value("sundial_executions_dispatched_total", tenant=tenant, pool="p") == 2


def test_exposition_answers_openmetrics_only_to_a_scraper_that_asks() -> None:
    assert exposition(OPENMETRICS)[1].startswith("application/openmetrics-text")
    assert exposition(None)[1].startswith("text/plain")
    assert exposition("*/*")[1].startswith("text/plain")


def test_serve_metrics_negotiates_openmetrics_over_http() -> None:
    with serve_probes(0) as port:
        url = f"http://127.0.0.1:{port}/metrics"
        scraped = httpx.get(url, headers={"Accept": OPENMETRICS})
        plain = httpx.get(url)
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert scraped.text.rstrip().endswith("# EOF")
    assert plain.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("main", [dispatcher_main, hydrator_main, sweeper_main, worker_main])
def test_every_background_process_takes_a_metrics_port(main: object, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])  # type: ignore[operator]
    text = " ".join(capsys.readouterr().out.split())
    assert "--metrics-port" in text
    assert "SUNDIAL_METRICS_PORT" in text
