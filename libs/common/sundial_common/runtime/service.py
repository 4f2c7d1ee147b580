"""How a Sundial process lives: uvloop, signals, named supervised tasks, periodic loops.

Every background loop has the same anatomy: a component with ``run_once()`` that does one pass and
returns counts, driven by :func:`every` until the stop event is set (or, for loops whose waits and
failures are their own, such as a shard leader's dispatch passes, by :func:`drive`, which :func:`every`
is built on). Side tasks are named and supervised: if one dies, the process fails loudly instead of
limping.

:func:`every` is also where a loop reports its passes: each pass runs in a span named ``"<loop> pass"``
(so whatever the pass traces is one tree) and is recorded in the process's metrics registry (passes,
errors, duration, and the counts ``run_once()`` returned; see :mod:`sundial_common.observability.metrics`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from sundial_common.observability.health import DEFAULT_STUCK_AFTER_SEC, HEALTH, LoopHealth
from sundial_common.observability.metrics import LoopMetrics, pass_counts
from sundial_common.observability.tracing import tracer
from sundial_common.runtime.stop_signals import StopSignals

log = logging.getLogger(__name__)

ResultT = TypeVar("ResultT")


def freeze_startup_heap() -> None:
    """Move everything built so far (imported modules, the app) out of the collector's sight.

    It lives as long as the process, yet every full collection walked it (py-spy: collections triggered
    by the per-execution allocations of the workers and the analytics ingest walked the import heap — chDB's
    pandas alone is ~40,000 objects; ~8 % of the API's CPU under wrk). Collected first, so no garbage is frozen.
    """
    gc.collect()
    gc.freeze()


def prepare_collector(young_collection_every: int | None = None) -> None:
    """The collector as a service runs under: the startup heap frozen (:func:`freeze_startup_heap`) and, if given,
    ``young_collection_every`` allocations between young-generation passes (CPython's default: 700) — for a
    process whose work per item allocates many short-lived objects that are almost never in cycles."""
    freeze_startup_heap()
    if young_collection_every is not None:
        _threshold, older, oldest = gc.get_threshold()
        gc.set_threshold(young_collection_every, older, oldest)


def run(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    *,
    on_force: Callable[[], None] | None = None,
    young_collection_every: int | None = None,
) -> int:
    """Run ``main(stop)`` on uvloop until it returns; SIGTERM/SIGINT set ``stop`` for a graceful shutdown.

    ``young_collection_every``: see :func:`prepare_collector`.

    Signals go through :class:`~sundial_common.runtime.stop_signals.StopSignals`: copies of the first signal (one
    Ctrl-C under ``uv run`` arrives twice) change nothing; a deliberate later one forces — ``on_force`` if
    given, else ``main`` is cancelled (its ``finally`` blocks still run) and the exit code is 1.
    """

    async def wrapper() -> None:
        stop = asyncio.Event()
        task = asyncio.current_task()
        assert task is not None

        def force() -> None:
            if on_force is not None:
                on_force()
            else:
                task.cancel()

        StopSignals(stop.set, force).install_on(asyncio.get_running_loop())
        HEALTH.watch(asyncio.get_running_loop())
        await main(stop)

    prepare_collector(young_collection_every)
    try:
        uvloop.run(wrapper())
    except asyncio.CancelledError:
        log.warning("stopped by force before the graceful shutdown finished")
        return 1
    except Exception:
        log.exception("process failed")
        return 1
    return 0


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stop`` is set; True if stopping."""
    if seconds <= 0:
        return stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def drive(
    run_once: Callable[[], Awaitable[ResultT]],
    *,
    active: Callable[[], bool],
    pause: Callable[[float], Awaitable[object]],
    wait_after: Callable[[ResultT], float | None],
    retry_after: Callable[[int], float],
    on_failure: Callable[[Exception, int, float], None],
    fatal: tuple[type[BaseException], ...] = (),
    pause_after_failure: Callable[[float], Awaitable[object]] | None = None,
) -> None:
    """The loop every background pass runs in: ``run_once`` while ``active()``, then ``pause(wait_after(result))``
    (``wait_after`` None: the next pass at once, without pausing).

    A pass that raises one of ``fatal`` ends the loop (the exception goes to the caller); any other error is reported
    (``on_failure(error, failures in a row, delay)``, called inside the ``except`` so a log line there carries the
    traceback) and the loop pauses ``retry_after(failures in a row)`` (with ``pause_after_failure``, default
    ``pause``) before the next pass. :func:`every` is this with a fixed interval and a stop event; a shard leader's
    dispatch passes run in it with waits of their own.
    """
    pause_after_failure = pause_after_failure or pause
    failures = 0
    while active():
        try:
            result = await run_once()
        except asyncio.CancelledError:
            raise
        except fatal:
            raise
        except Exception as exc:
            failures += 1
            delay = retry_after(failures)
            on_failure(exc, failures, delay)
            await pause_after_failure(delay)
            continue
        failures = 0
        wait = wait_after(result)
        if wait is not None:
            await pause(wait)


async def every(
    stop: asyncio.Event,
    interval: float,
    run_once: Callable[[], Awaitable[Any]],
    *,
    name: str,
    again_now: Callable[[Any], bool] = lambda _result: False,
    idle_interval: float | None = None,
) -> None:
    """Call ``run_once`` every ``interval`` seconds until ``stop``; errors are logged and retried.

    ``again_now(result)`` lets a pass that found a full batch go again without waiting. ``name`` labels
    the loop's pass metrics and spans, so it is fixed by the code (``hydrate``, ``sweep``, …).

    ``idle_interval``: while passes do nothing (every count of the result is 0, see ``pass_counts``), the
    wait doubles from ``interval`` up to this; the first pass that does something brings it back to
    ``interval``. For loops that poll for rare work (the replayer, the analytics ingester): idle, they
    wake a few times a minute instead of twice a second, and the first piece of work after a quiet spell
    waits at most ``idle_interval``. Not for loops whose period is a detection window (the sweeper's).

    The loop feeds the process's probes (:mod:`sundial_common.observability.health`): a failed last pass makes
    the process not ready, a pass running far longer than ``interval`` makes it not alive.
    """
    metrics = LoopMetrics(name)
    health = HEALTH.loop(name, stuck_after_sec=max(DEFAULT_STUCK_AFTER_SEC, 10 * interval))
    try:
        await _every(stop, interval, run_once, name, again_now, idle_interval, metrics, health)
    finally:
        HEALTH.forget(name)


async def _every(
    stop: asyncio.Event,
    interval: float,
    run_once: Callable[[], Awaitable[Any]],
    name: str,
    again_now: Callable[[Any], bool],
    idle_interval: float | None,
    metrics: LoopMetrics,
    health: LoopHealth,
) -> None:
    """:func:`every`'s passes in :func:`drive`: each in a span, recorded in the metrics and the probes."""
    span_name = f"{name} pass"
    wait = interval
    started = time.perf_counter()

    async def one_pass() -> Any:
        nonlocal started
        started = time.perf_counter()
        health.starting()
        with tracer.start_as_current_span(span_name, attributes={"sundial.loop": name}) as span:
            result = await run_once()
            if span.is_recording():
                for item, count in pass_counts(result).items():
                    span.set_attribute(f"sundial.loop.{item}", count)
        return result

    def wait_after(result: Any) -> float | None:
        nonlocal wait
        metrics.passed(time.perf_counter() - started, result)
        health.passed()
        if idle_interval is not None:
            idle = not any(pass_counts(result).values())
            wait = min(max(idle_interval, interval), wait * 2) if idle else interval
        return None if again_now(result) else wait

    def failed(exc: Exception, _failures: int, delay: float) -> None:
        metrics.failed(time.perf_counter() - started)
        health.failed(exc)
        log.exception("%s pass failed; retrying in %.1fs", name, delay)

    stopping = False

    async def pause(seconds: float) -> None:
        nonlocal stopping
        stopping = await sleep_or_stop(stop, seconds)

    await drive(
        one_pass,
        active=lambda: not (stopping or stop.is_set()),
        pause=pause,
        wait_after=wait_after,
        retry_after=lambda _failures: max(interval, 1.0),
        on_failure=failed,
    )


async def supervise(stop: asyncio.Event, tasks: dict[str, Coroutine[Any, Any, None]]) -> None:
    """Run named tasks until all finish; the first one to die stops the rest and re-raises."""
    running = {asyncio.create_task(coro, name=name) for name, coro in tasks.items()}
    try:
        while running:
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and (exc := task.exception()) is not None:
                    log.error("task %s died: %r; stopping", task.get_name(), exc)
                    raise exc
                if not stop.is_set():
                    log.error("task %s exited before stop was requested", task.get_name())
                    raise RuntimeError(f"task {task.get_name()} exited unexpectedly")
    finally:
        stop.set()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
