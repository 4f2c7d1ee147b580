"""The worker's own Python per execution, without I/O: CPU microseconds to decode a batch of execution messages,
launch each won execution's handler (``echo``, async), run it, and turn it into a sealed outcome in the buffer
the flusher writes from — what a W3 worker does per execution besides its Kafka, Postgres and Redis round trips.

What a W3 run cannot tell apart on a shared 2-core machine (its neighbours move a worker's CPU per execution by
±20 % between two runs of the same code): this is one process on uvloop, no servers. Tracing as a process without
an exporter sets it up; the payload and the outcome are sealed with a real tenant key; the collector is set up as
``sundial worker`` sets it up (what startup built frozen; its young-generation threshold, if the CLI sets one).

    uv run --frozen python -m bench worker-python [--batch 40] [--passes 2000]

Prints one JSON line (appended to ``bench/results/worker-python.jsonl``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvloop
from sundial_common.broker.messages import ExecutionMessage
from sundial_common.domain.ids import new_id, parse_id
from sundial_common.observability.tracing import setup_tracing
from sundial_common.runtime.service import prepare_collector
from sundial_common.security.encryption import PAYLOAD, TenantCipher
from sundial_worker import cli
from sundial_worker.consumer import Delivery
from sundial_worker.demo import worker
from sundial_worker.execution import ExecutionConfig, HandlerExecutor
from sundial_worker.inflight import InFlight, OutcomeBuffer, WorkerStats
from sundial_worker.sdk import Context

from bench import results

TENANT = "acme"


class _Keys:
    """The one tenant's cipher, as the keyring holds it once admission has loaded it."""

    def __init__(self) -> None:
        self.cipher = TenantCipher(TENANT, os.urandom(32))

    def cached(self, tenant: str) -> TenantCipher | None:
        return self.cipher


class _NoHeartbeats:
    async def heartbeat(self, ctx: Context, progress: Any | None) -> None:
        return None


def _message(cipher: TenantCipher, due: datetime) -> tuple[bytes, dict[str, Any]]:
    """A message body as a dispatcher publishes it, and the row its start CAS returns."""
    execution_id, job_id = new_id(), new_id()
    body = ExecutionMessage(
        execution_id=str(execution_id),
        job_id=str(job_id),
        tenant_id=TENANT,
        pool="demo",
        handler="echo",
        attempt=1,
        fence_token=7,
        scheduled_for=due.isoformat(),
        timeout_sec=60,
        payload=cipher.seal_json({"n": 1, "text": "x" * 40}, PAYLOAD),
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ).encode()
    row = {
        "id": execution_id,
        "attempt": 1,
        "tenant_id": TENANT,
        "job_id": job_id,
        "scheduled_for": due,
        "fire_at": due,
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "previous_progress": None,
        "retry_policy": None,
    }
    return body, row


async def measure(batch: int, passes: int) -> float:
    """CPU microseconds per execution of ``passes`` passes of ``batch`` messages each."""
    keys = _Keys()
    inflight, outcomes, stats = InFlight(), OutcomeBuffer(batch), WorkerStats()
    executor = HandlerExecutor(
        worker,
        "bench-worker",
        ExecutionConfig(concurrency=batch),
        inflight=inflight,
        outcomes=outcomes,
        heartbeats=_NoHeartbeats(),
        stats=stats,
        keyring=keys,  # type: ignore[arg-type]
        on_failure=lambda what, exc: print(what, exc, file=sys.stderr),
    )
    executor.open()
    due = datetime.now(UTC) - timedelta(milliseconds=5)
    made = [_message(keys.cipher, due) for _ in range(batch)]

    async def one_pass() -> None:
        for offset, (body, row) in enumerate(made):
            delivery = Delivery("sundial.pool.demo", 0, offset, body, None, due)
            message = ExecutionMessage.decode(body)
            execution_id = parse_id(message.execution_id)  # as admission decodes it
            executor.launch(execution_id, message, [delivery], row)
        while len(outcomes) < batch:
            outcomes.ready.clear()
            await outcomes.ready.wait()
        for finished in outcomes.items:
            inflight.settle(finished.outcome.execution_id)
        outcomes.items.clear()

    for _ in range(max(1, passes // 20)):
        await one_pass()
    started = time.process_time()
    for _ in range(passes):
        await one_pass()
    elapsed = time.process_time() - started
    executor.close()
    return elapsed / (passes * batch) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench worker-python", description=__doc__)
    parser.add_argument("--batch", type=int, default=40, help="messages per pass")
    parser.add_argument("--passes", type=int, default=2000)
    parser.add_argument("--results", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    setup_tracing("bench", None)  # as a process without SUNDIAL_OTLP_ENDPOINT
    prepare_collector(cli.GC_THRESHOLD)  # as the service's CLI runs it
    settings = {"batch": args.batch, "passes": args.passes, "gc_threshold": gc.get_threshold()[0]}
    figures = {"us_per_execution": round(uvloop.run(measure(args.batch, args.passes)), 1)}
    results.record("worker-python", figures, settings, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
