"""Every process goes through the same observability setup: real hydrator and sweeper processes serve
``/metrics`` with their loop pass counts, and export spans with real trace ids to an OTLP/HTTP receiver.

The receiver (:mod:`tests.support.otlp`) is a small HTTP server of the test's own that decodes the exported
protobuf (opentelemetry-proto) — exactly what Jaeger's OTLP endpoint receives.
"""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.otlp import OtlpReceiver
from tests.support.processes import Processes, free_port


def loop_passes(metrics_port: int, loop: str) -> tuple[float, set[str]]:
    """``sundial_loop_passes_total{loop}`` and the item labels counted for it, as scraped from the process."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
    passes, items = 0.0, set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("loop") != loop:
                continue
            if sample.name == "sundial_loop_passes_total":
                passes = sample.value
            elif sample.name == "sundial_loop_pass_duration_seconds_count":
                items.add("duration")
    return passes, items


@pytest.mark.e2e
@pytest.mark.parametrize(("command", "loop"), [("hydrator", "hydrate"), ("sweeper", "sweep")])
def test_a_loop_process_serves_its_pass_counts_and_exports_real_trace_ids(
    processes: Processes, otlp: OtlpReceiver, command: str, loop: str
) -> None:
    metrics_port = free_port()
    processes.start(
        command,
        command,
        "--interval",
        "0.2",
        env={
            "SUNDIAL_METRICS_PORT": str(metrics_port),
            "SUNDIAL_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # export within moments, not the SDK's 5 s
            "SUNDIAL_INSTANCE_ID": f"{command}-observed",
        },
    )
    processes.wait_http_ok(command, f"http://127.0.0.1:{metrics_port}/metrics")

    deadline = time.monotonic() + 30
    passes, seen = 0.0, set[str]()
    while time.monotonic() < deadline and passes < 3:
        passes, seen = loop_passes(metrics_port, loop)
        time.sleep(0.1)
    assert passes >= 3, processes.log(command)[-3000:]
    assert "duration" in seen
    info = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).text
    assert f'sundial_process_info{{instance="{command}-observed",service="sundial-{command}"}} 1.0' in info

    service = f"sundial-{command}"
    while time.monotonic() < deadline and not any(
        s.service == service and s.name == f"{loop} pass" for s in otlp.spans
    ):
        time.sleep(0.1)
    mine = [s for s in otlp.spans if s.service == service]
    assert mine, processes.log(command)[-3000:]
    names = {s.name for s in mine}
    # Each loop of the process exports its passes (the sweeper also runs the retry breakers' loop).
    assert f"{loop} pass" in names and all(name.endswith(" pass") for name in names), names
    assert all(s.trace_id != "0" * 32 for s in mine)  # trace id 0 is what a process without the setup sends
    assert len({s.trace_id for s in mine}) == len(mine)  # one trace per pass
