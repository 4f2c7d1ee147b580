"""The delivery module's own CPU per outbound request: ``Sender.send`` to a local keep-alive receiver.

What an HTTP-target delivery worker spends per execution besides its Kafka, Postgres and Redis round trips: the
URL and address check, signing, the HTTP/1.1 request and response (httpx/httpcore), the span and the metrics.
The receiver (:mod:`bench.target_receiver`, answering ``200 {}`` at once) runs in a process of its own, so the
CPU measured here (``time.process_time`` of this process) is the sender's alone. ``--in-flight`` sends run at
once, as a delivery worker's handlers do; the sender is the one a delivery worker builds (``SUNDIAL_ENV=dev``,
the receiver's loopback address allowed for the destination).

    uv run --frozen python -m bench delivery [--sends 3000] [--in-flight 64] [--connections 100] [--port 16510]

Prints one JSON line (appended to ``bench/results/delivery.jsonl``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import subprocess
import sys
import time
from pathlib import Path

import uvloop
from sundial_common.delivery.sender import OutboundRequest, Sender, SenderConfig
from sundial_common.observability.tracing import setup_tracing

from bench import results

_BODY = b'{"executionId":"0190f3b2-7c1e-7d3a-9f00-000000000000","payload":{"n":1}}'


async def _wait_listening(port: int, deadline_sec: float = 10.0) -> None:
    end = time.monotonic() + deadline_sec
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


async def measure(port: int, sends: int, in_flight: int, connections: int = 100) -> dict[str, float]:
    """CPU milliseconds per send and sends a second (wall) over ``sends`` after a warm-up."""
    await _wait_listening(port)
    sender = Sender(SenderConfig(allow_http=True, max_connections=connections))
    request = OutboundRequest(
        url=f"http://localhost:{port}/run",
        body=_BODY,
        msg_id="0190f3b2-7c1e-7d3a-9f00-000000000000:1",
        secrets=("whsec_" + "A" * 44,),
        purpose="target",
        headers={"idempotency-key": "0190f3b2-7c1e-7d3a-9f00-000000000000:1"},
        allowed=(ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")),
    )
    failed = 0

    async def run(count: int) -> None:
        nonlocal failed
        left = count

        async def one() -> None:
            nonlocal left, failed
            while left > 0:
                left -= 1
                outcome = await sender.send(request)
                if not outcome.ok:
                    failed += 1

        await asyncio.gather(*(one() for _ in range(in_flight)))

    async with sender:
        await run(max(in_flight, sends // 10))
        failed = 0
        cpu, wall = time.process_time(), time.perf_counter()
        await run(sends)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "cpu_ms_per_send": round(cpu / sends * 1000, 3),
        "sends_per_sec": round(sends / wall, 1),
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench delivery", description=__doc__)
    parser.add_argument("--sends", type=int, default=3000, help="sends measured (after a tenth as warm-up)")
    parser.add_argument("--in-flight", type=int, default=64, help="sends running at once")
    parser.add_argument("--connections", type=int, default=100, help="the sender's connection pool limit")
    parser.add_argument("--port", type=int, default=16510, help="the receiver's port on 127.0.0.1")
    parser.add_argument("--results", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    if args.sends < 1 or args.in_flight < 1 or args.connections < 1:
        parser.error("--sends, --in-flight and --connections must be at least 1")
    setup_tracing("bench", None)  # as a process without SUNDIAL_OTLP_ENDPOINT
    receiver = subprocess.Popen(
        [sys.executable, "-m", "bench.target_receiver", "--port", str(args.port)], stdout=subprocess.DEVNULL
    )
    try:
        figures = uvloop.run(measure(args.port, args.sends, args.in_flight, args.connections))
    finally:
        receiver.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            receiver.wait(5)
    settings = {"sends": args.sends, "in_flight": args.in_flight, "connections": args.connections}
    results.record("delivery", figures, settings, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
