"""The gateway transport's pulls: two in flight at once, each for its share of the free slots, each saying what the
worker is (concurrency, free slots, handlers) so the gateway can announce it as a live worker of the pool."""

from __future__ import annotations

import asyncio
from typing import Any

from sundial_worker import Context, Worker
from sundial_worker.gateway_runtime import GatewayConfig, GatewayRuntime


class _Gateway:
    """A gateway whose pulls are held until released, recording what they asked for."""

    url = "http://gateway.test"

    def __init__(self) -> None:
        self.pulls: list[dict[str, Any]] = []
        self.in_flight = 0
        self.release = asyncio.Event()

    async def call(self, path: str, body: dict[str, Any], **_: Any) -> Any:
        assert path == "/v1/worker/pull", path
        self.pulls.append(body)
        self.in_flight += 1
        try:
            await self.release.wait()
            await asyncio.sleep(0.01)  # an answer takes a moment (a released call must not spin)
        finally:
            self.in_flight -= 1
        return {"executions": []}

    async def close(self) -> None:
        return None


async def test_two_pulls_are_in_flight_each_for_half_the_slots_saying_what_the_worker_is() -> None:
    worker = Worker(pool="mail", concurrency=16)

    @worker.handler("send")
    async def send(ctx: Context, payload: Any) -> None:
        return None

    gateway = _Gateway()
    fake: Any = gateway
    runtime = GatewayRuntime(
        worker, GatewayConfig(urls=("http://gateway.test",), token="t", concurrency=16), client=fake
    )
    stop = asyncio.Event()
    running = asyncio.create_task(runtime.run_until(stop))
    try:
        for _ in range(100):
            if gateway.in_flight == 2:
                break
            await asyncio.sleep(0.01)
        assert gateway.in_flight == 2, "a second pull waits beside the first"
        assert [p["max"] for p in gateway.pulls] == [8, 8], "each for its share: together no more than the slots"
        said = gateway.pulls[0]["worker"]
        assert said["concurrency"] == 16 and said["freeSlots"] == 16 and said["handlers"] == ["send"]
        assert {p["session"] for p in gateway.pulls} == {runtime.session}
    finally:
        stop.set()
        gateway.release.set()
        await asyncio.wait_for(running, 10)
