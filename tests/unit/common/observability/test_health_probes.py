"""The probes of a process without an HTTP server of its own: each fails when what it checks is broken."""

from __future__ import annotations

import asyncio
import time

import httpx
from sundial_common.observability.health import HEALTH, Health
from sundial_common.observability.probes import serve_probes
from sundial_common.runtime.service import every


def test_a_failed_pass_makes_the_process_not_ready_until_a_pass_succeeds() -> None:
    health = Health()
    loop = health.loop("hydrate")
    assert health.readiness() == []
    loop.starting()
    loop.failed(ConnectionError("redis at 127.0.0.1:1 refused"))
    assert health.readiness() == ["hydrate: last pass failed: ConnectionError: redis at 127.0.0.1:1 refused"]
    assert health.liveness() == []  # a dependency down is no reason to restart the process
    loop.starting()
    loop.passed()
    assert health.readiness() == []


def test_a_pass_running_past_its_limit_makes_the_process_not_alive() -> None:
    health = Health()
    loop = health.loop("sweep", stuck_after_sec=0.05)
    loop.starting()
    assert health.liveness() == []
    time.sleep(0.1)
    [problem] = health.liveness()
    assert problem.startswith("sweep: pass running for")


def test_a_blocked_event_loop_makes_the_process_not_alive() -> None:
    health = Health(loop_timeout_sec=0.2)

    async def block() -> list[str]:
        health.watch(asyncio.get_running_loop())
        answers: list[list[str]] = []
        probe = asyncio.get_running_loop().run_in_executor(None, lambda: answers.append(health.liveness()))
        time.sleep(0.5)  # the event loop runs nothing meanwhile
        await probe
        await asyncio.get_running_loop().run_in_executor(None, lambda: answers.append(health.liveness()))  # turns again
        return [*answers[0], *answers[1]]

    assert asyncio.run(block()) == ["event loop: no callback ran within 0.2 s"]


def test_a_condition_that_raises_reads_as_not_ready() -> None:
    health = Health()
    health.require("consumer", lambda: str(1 // 0))
    assert health.readiness() == ["consumer: ZeroDivisionError: integer division or modulo by zero"]


async def test_a_loop_driven_by_every_feeds_the_probes_over_http() -> None:
    stop, failing, passing = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def run_once() -> None:
        if not failing.is_set():
            failing.set()
            raise OSError("etcd unreachable")
        passing.set()

    with serve_probes(0) as port:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as http:
            task = asyncio.create_task(every(stop, 0.01, run_once, name="probe-test"))
            await failing.wait()
            await asyncio.sleep(0)  # every() records the failure
            ready = await http.get("/readyz")
            assert ready.status_code == 503
            assert "probe-test: last pass failed: OSError: etcd unreachable" in ready.text
            assert (await http.get("/healthz")).status_code == 200
            await passing.wait()  # the retry comes a second later
            await asyncio.sleep(0)
            assert (await http.get("/readyz")).text == "ok\n"
            assert (await http.get("/anything-else")).status_code == 404
            assert (await http.get("/version")).status_code == 200
            stop.set()
            await task
    assert "probe-test" not in HEALTH.loops  # an ended loop no longer counts
