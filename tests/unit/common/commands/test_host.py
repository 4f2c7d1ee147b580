"""`sundial services`: services side by side in one process stop together, and one failing takes the process down."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sundial_common.commands.host import hosted_services, run_side_by_side
from sundial_common.runtime.logs import SERVICE, ServiceField


class Life:
    """A fake service: waits for stop, then finishes its pass (``stopped``), unless told to fail or to end early."""

    def __init__(self, *, fail: bool = False, end_early: bool = False, ignore_stop: bool = False) -> None:
        self.fail = fail
        self.end_early = end_early
        self.ignore_stop = ignore_stop
        self.named: str | None = None
        self.stopped = False

    async def __call__(self, stop: asyncio.Event) -> None:
        self.named = SERVICE.get()
        await asyncio.sleep(0)
        if self.fail:
            raise ValueError("the service broke")
        if self.end_early:
            return
        await stop.wait()
        if self.ignore_stop:
            await asyncio.Event().wait()
        self.stopped = True


async def test_every_service_runs_until_stop_and_each_knows_its_name_for_the_logs() -> None:
    stop = asyncio.Event()
    lives = {"hydrator": Life(), "sweeper": Life()}
    running = asyncio.create_task(run_side_by_side(stop, lives))
    await asyncio.sleep(0.01)
    assert not running.done()
    stop.set()
    await running
    assert all(life.stopped for life in lives.values())
    assert {name: life.named for name, life in lives.items()} == {"hydrator": "hydrator", "sweeper": "sweeper"}
    assert SERVICE.get() is None  # the host's own context names no service


async def test_one_service_failing_stops_the_others_gracefully_and_raises_its_error() -> None:
    stop = asyncio.Event()
    lives = {"hydrator": Life(), "sweeper": Life(fail=True), "replayer": Life()}
    with pytest.raises(ValueError, match="the service broke"):
        await run_side_by_side(stop, lives)
    assert stop.is_set()
    assert lives["hydrator"].stopped and lives["replayer"].stopped  # finished their pass: they resign, not vanish


async def test_a_service_ending_before_stop_is_a_failure_of_the_process() -> None:
    stop = asyncio.Event()
    lives = {"hydrator": Life(end_early=True), "sweeper": Life()}
    with pytest.raises(RuntimeError, match="hydrator ended unexpectedly"):
        await run_side_by_side(stop, lives)
    assert lives["sweeper"].stopped


async def test_a_service_that_does_not_stop_within_the_grace_is_cancelled() -> None:
    stop = asyncio.Event()
    stubborn = Life(ignore_stop=True)
    with pytest.raises(ValueError, match="the service broke"):
        await run_side_by_side(stop, {"sweeper": Life(fail=True), "replayer": stubborn}, grace_sec=0.05)
    assert not stubborn.stopped


async def test_a_host_stopped_by_force_cancels_every_service() -> None:
    stop = asyncio.Event()
    stubborn = Life(ignore_stop=True)
    host = asyncio.create_task(run_side_by_side(stop, {"replayer": stubborn}))
    await asyncio.sleep(0.01)
    host.cancel()
    with pytest.raises(asyncio.CancelledError):
        await host
    assert not stubborn.stopped and not any(t.get_name() == "replayer" for t in asyncio.all_tasks())


def test_a_log_line_says_which_hosted_service_wrote_it() -> None:
    def record() -> logging.LogRecord:
        line = logging.LogRecord(
            "sundial_common.coordination.leadership", logging.INFO, __file__, 1, "leading", None, None
        )
        ServiceField().filter(line)
        return line

    assert getattr(record(), "service", None) is None  # a process of one service: nothing added
    token = SERVICE.set("sweeper")
    try:
        assert getattr(record(), "service", None) == "sweeper"
    finally:
        SERVICE.reset(token)


def test_the_singletons_offer_themselves_to_a_host() -> None:
    services = hosted_services()
    assert {"hydrator", "sweeper", "replayer"} <= set(services)
    assert all(service.name == name for name, service in services.items())
