"""The gateway transport: a Worker's handlers served through the worker gateway, holding only a pool token.

``sundial worker --app module:worker`` with ``SUNDIAL_WORKER_GATEWAY`` set runs this runtime instead of the direct
one: the same handlers, the same :class:`~sundial_worker.sdk.Context` (``ctx.heartbeat(progress=…)``,
``ctx.cancelled``, ``ctx.previous_progress``), but no database, Redis, broker or master key — the gateway holds them.

- **pull** (task ``pull``): as many executions as there are free handler slots, long-polling the gateway with two
  pulls in flight (each for at most half the slots), so that what comes due while one pull's answer travels is taken
  by the other rather than wait for the next pull; each execution is already started for this worker (its start
  compare-and-swap won) and comes with its payload and attempt token. Each pull says what the worker is (its
  concurrency, free slots, handlers and version): the gateway announces it as a live worker of the pool, as a direct
  worker announces itself;
- **handlers**: one task each (a sync handler in a thread), interrupted at the attempt's deadline (TIMED_OUT) or a
  cancel (CANCELLED) — ``ctx.cancelled`` turns true, the task is cancelled, and a handler still running
  ``cancel_grace_sec`` later is abandoned;
- **heartbeat** (task ``heartbeat``, every ``heartbeat_interval_sec``): every running execution, with the progress
  reported since the last beat; the answer says which to cancel and which are no longer this worker's (their
  handlers are stopped and their outcomes not sent: they would be rejected);
- **finish** (task ``finish``): outcomes in batches (``flush_interval_sec`` of company), each sent until a gateway
  answers — accepted, or rejected as stale.

A stop (SIGTERM) stops pulling, lets running handlers end within ``shutdown_grace_sec`` and sends their outcomes; a
handler still running then is abandoned, and its execution goes to the sweeper once its liveness key expires.
The worker's ``session`` is a random id per process: its executions can be heartbeated and finished by it alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import httpx
import orjson

from sundial_worker.announcer import sdk_version
from sundial_worker.gateway_client import GatewayClient, GatewayRefused
from sundial_worker.log_tail import log_tail, traceback_text
from sundial_worker.sdk import Context, Worker, context_logger

log = logging.getLogger("sundial.worker")
handler_log = logging.getLogger("sundial.handler")

#: The longest a pull waits at the gateway: also how long a stop may wait for the pull in flight.
_PULL_WAIT_MS = 2000
_SDK_VERSION = sdk_version()
#: Pulls in flight at once, each for at most this share of the slots (the direct worker's two claims in flight).
_PULLS_IN_FLIGHT = 2


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    urls: tuple[str, ...]
    token: str | None = None
    token_file: str | None = None
    concurrency: int = 16
    heartbeat_interval_sec: float = 2.0
    shutdown_grace_sec: float = 30.0
    cancel_grace_sec: float = 5.0
    flush_interval_sec: float = 0.005


@dataclass(eq=False)
class _Running:
    lease: dict[str, Any]
    ctx: Context
    task: asyncio.Task[None] | None = None
    #: Progress reported since the last heartbeat (sent with the next one).
    progress: Any = None
    progress_pending: bool = False
    #: Set when the gateway says the attempt is no longer this worker's: its outcome is not sent.
    lost: bool = False
    cancel_reason: str | None = None
    #: Set when the handler has ended (and its slot is free).
    done: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when a heartbeat's answer asks to stop the handler.
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class GatewayRuntime:
    """Serves one Worker's handlers through the gateway: see the module docstring."""

    def __init__(self, worker: Worker, config: GatewayConfig, *, client: GatewayClient | None = None) -> None:
        self.worker = worker
        self.config = config
        # One line per gateway call at INFO would drown the handlers' own lines.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.session = f"py-{secrets.token_hex(8)}"
        self._client = client or GatewayClient(config.urls, token=config.token, token_file=config.token_file)
        self._running: dict[str, _Running] = {}
        self._outcomes: list[dict[str, Any]] = []
        self._outcome_ready = asyncio.Event()
        self._slot_freed = asyncio.Event()
        #: Slots the pulls in flight asked for (each pull asks only for slots no other pull asked for).
        self._asked = 0
        #: Whether pulls say what this worker is (``worker``); off once a gateway refuses the field.
        self._say_worker = True
        self._threads = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="sundial-handler")
        self._stopping = asyncio.Event()
        self._forced = False
        self.stuck_sync_handlers = 0
        self.started = 0

    # --- lifecycle ----------------------------------------------------------------------------

    def force_stop(self) -> None:
        """Abandon running handlers now (a second signal)."""
        self._forced = True
        for running in list(self._running.values()):
            if running.task is not None:
                running.task.cancel()

    async def run_until(self, stop: asyncio.Event) -> None:
        log.info(
            "serving pool %s through gateway %s (session %s, %d slots)",
            self.worker.pool,
            self._client.url,
            self.session,
            self.config.concurrency,
        )
        tasks = [
            asyncio.create_task(self._pull(), name="sundial-worker-pull"),
            asyncio.create_task(self._heartbeat(), name="sundial-worker-heartbeat"),
        ]
        flusher = asyncio.create_task(self._finish(), name="sundial-worker-finish")
        try:
            waiter = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([waiter, *tasks, flusher], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            for task in done:
                if task is not waiter:
                    task.result()  # a loop ended by a bug: raise it
            log.info(
                "stopping: no more pulls; waiting up to %.0fs for running handlers", self.config.shutdown_grace_sec
            )
            self._stopping.set()
            await asyncio.wait([tasks[0]])
            await self._drain()
        finally:
            self._stopping.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._outcome_ready.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(flusher, 10)
            flusher.cancel()
            self.stuck_sync_handlers = sum(
                1 for r in self._running.values() if r.task is not None and not r.task.done()
            )
            self._threads.shutdown(wait=False)
            await self._client.close()

    async def _drain(self) -> None:
        pending = [r.done.wait() for r in self._running.values()]
        if pending:
            _, still = await asyncio.wait(
                [asyncio.create_task(p) for p in pending], timeout=self.config.shutdown_grace_sec
            )
            if still:
                log.warning("%d handlers still running after the shutdown grace: abandoned to the sweeper", len(still))
                self.force_stop()
        while self._outcomes:
            self._outcome_ready.set()
            await asyncio.sleep(0.01)

    # --- pull ---------------------------------------------------------------------------------

    async def _pull(self) -> None:
        pulls = [asyncio.create_task(self._pull_loop(), name=f"sundial-pull-{n}") for n in range(_PULLS_IN_FLIGHT)]
        try:
            await asyncio.gather(*pulls)
        finally:
            for task in pulls:
                task.cancel()
            await asyncio.gather(*pulls, return_exceptions=True)

    async def _pull_loop(self) -> None:
        share = -(-self.config.concurrency // _PULLS_IN_FLIGHT)
        while not self._stopping.is_set():
            free = self.config.concurrency - len(self._running) - self._asked
            if free <= 0:
                self._slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_freed.wait(), 1.0)
                continue
            most = min(free, share)
            body: dict[str, Any] = {"session": self.session, "max": most, "waitMs": _PULL_WAIT_MS}
            if self._say_worker:
                body["worker"] = _worker_info(self.worker, self.config.concurrency, len(self._running))
            self._asked += most
            try:
                answer = await self._client.call("/v1/worker/pull", body, wait_sec=_PULL_WAIT_MS / 1000)
            except GatewayRefused as exc:
                if exc.status == 422 and "worker" in exc.detail and self._say_worker:
                    # A gateway older than this SDK: it announces the worker with `max` slots instead.
                    log.info("the gateway does not take a pull's `worker`; pulling without it")
                    self._say_worker = False
                    continue
                log.error("pull refused: %s", exc)
                await asyncio.sleep(1.0)
                continue
            finally:
                self._asked -= most
                self._slot_freed.set()  # the other pull may ask for what this one did not get
            for lease in answer["executions"]:
                self._launch(lease)

    def _launch(self, lease: dict[str, Any]) -> None:
        execution_id = UUID(lease["executionId"])
        ctx = Context(
            execution_id=execution_id,
            job_id=UUID(lease["jobId"]),
            tenant=lease["tenant"],
            attempt=lease["attempt"],
            fence_token=0,
            scheduled_for=datetime.fromisoformat(lease["scheduledFor"]),
            handler=lease["handler"],
            pool=self.worker.pool,
            trace_id=lease.get("traceId"),
            logger=context_logger(
                handler_log,
                tenant=lease["tenant"],
                job_id=UUID(lease["jobId"]),
                execution_id=execution_id,
                attempt=lease["attempt"],
                trace_id=lease.get("traceId"),
            ),
            previous_progress=lease.get("previousProgress"),
        )
        running = _Running(lease, ctx)
        ctx._sink = _Sink(self, running)
        self._running[lease["executionId"]] = running
        self.started += 1
        running.task = asyncio.create_task(self._run(running), name=f"sundial-handler-{execution_id}")

    # --- handlers -----------------------------------------------------------------------------

    async def _run(self, running: _Running) -> None:
        lease, ctx = running.lease, running.ctx
        try:
            outcome = await self._invoke(running)
        except asyncio.CancelledError:
            outcome = None  # abandoned (a forced stop): the sweeper takes the execution
        finally:
            self._running.pop(lease["executionId"], None)
            running.done.set()
            self._slot_freed.set()
        if outcome is not None and not running.lost:
            self._outcomes.append(
                {
                    "executionId": lease["executionId"],
                    "attempt": lease["attempt"],
                    "attemptToken": lease["attemptToken"],
                    "logTail": log_tail(ctx.logger),
                    **outcome,
                }
            )
            self._outcome_ready.set()

    async def _invoke(self, running: _Running) -> dict[str, Any]:
        lease, ctx = running.lease, running.ctx
        spec = self.worker.registry.get(lease["handler"])
        if spec is None:
            message = self.worker.registry.unknown_handler_error(lease["handler"])
            return {"state": "FAILED", "error": {"type": "UnknownHandler", "message": message.split(": ", 1)[-1]}}
        if spec.is_async:
            work: asyncio.Future[Any] = asyncio.ensure_future(spec.func(ctx, lease["payload"]))
        else:
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(self._threads, spec.func, ctx, lease["payload"])
        deadline = _deadline(lease.get("deadline"))
        while not work.done():
            running.wake.clear()
            timeout = None if deadline is None else deadline - time.time()
            if running.cancel_reason is not None or (timeout is not None and timeout <= 0):
                return await self._interrupt(running, work, timed_out=running.cancel_reason is None)
            wake = asyncio.ensure_future(running.wake.wait())
            await asyncio.wait({work, wake}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
        try:
            result = work.result()
        except (Exception, asyncio.CancelledError) as exc:
            ctx.logger.error("handler %s failed: %s: %s", spec.name, type(exc).__name__, exc)
            return {"state": "FAILED", "error": _error(exc)}
        try:
            orjson.dumps(result)
        except TypeError as exc:
            return {"state": "FAILED", "error": {"type": "TypeError", "message": f"result is not JSON: {exc}"}}
        return {"state": "SUCCEEDED", "result": result}

    async def _interrupt(self, running: _Running, work: asyncio.Future[Any], *, timed_out: bool) -> dict[str, Any]:
        running.ctx.request_cancel()
        work.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(work), self.config.cancel_grace_sec)
        if timed_out:
            timeout = running.lease.get("timeoutSec")
            return {"state": "TIMED_OUT", "error": {"type": "TimeoutError", "message": f"timed out after {timeout}s"}}
        return {"state": "CANCELLED", "error": {"type": "Cancelled", "message": running.cancel_reason or "cancelled"}}

    # --- heartbeat ----------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_sec)
            await self.beat()

    async def beat(self, only: Sequence[_Running] | None = None) -> None:
        """One heartbeat for every running execution, or ``only`` these (with the progress reported since the
        last)."""
        running = list(self._running.values()) if only is None else list(only)
        if not running:
            return
        items = []
        for r in running:
            item = {
                "executionId": r.lease["executionId"],
                "attempt": r.lease["attempt"],
                "attemptToken": r.lease["attemptToken"],
            }
            if r.progress_pending:
                item["progress"] = r.progress
                r.progress_pending = False
            items.append(item)
        try:
            answer = await self._client.call(
                "/v1/worker/heartbeat",
                {"session": self.session, "running": items},
                give_up_at=time.monotonic() + self.config.heartbeat_interval_sec,
            )
        except (GatewayRefused, httpx.HTTPError) as exc:
            log.warning("heartbeat failed (the next one retries): %s", exc)
            return
        by_id = {one.lease["executionId"]: one for one in running}
        for beat in answer["running"]:
            found = by_id.get(beat["executionId"])
            if found is None:
                continue
            if not beat["renewed"]:
                found.ctx.logger.warning("attempt lost: %s; stopping its handler", beat.get("reason"))
                found.lost = True
                found.cancel_reason = beat.get("reason") or "lost"
            elif beat["cancel"] and found.cancel_reason is None:
                found.cancel_reason = beat.get("reason") or "cancel requested"
            if found.cancel_reason is not None:
                found.ctx.request_cancel()
                found.wake.set()

    # --- finish -------------------------------------------------------------------------------

    async def _finish(self) -> None:
        while True:
            if not self._outcomes:
                if self._stopping.is_set() and not self._running:
                    return
                self._outcome_ready.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._outcome_ready.wait(), 0.5)
                continue
            await asyncio.sleep(self.config.flush_interval_sec)  # a few milliseconds of company: one call for many
            batch, self._outcomes = self._outcomes[:256], self._outcomes[256:]
            await self.send(batch)

    async def send(self, outcomes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send ``outcomes`` until a gateway answers; the answers (accepted or rejected, each)."""
        while True:
            try:
                answer = await self._client.call("/v1/worker/finish", {"session": self.session, "outcomes": outcomes})
            except GatewayRefused as exc:
                log.error("finish refused (%d outcomes not recorded): %s", len(outcomes), exc)
                return []
            answers: list[dict[str, Any]] = answer["outcomes"]
            for item in answers:
                if not item["accepted"]:
                    log.warning("outcome of %s rejected: %s", item["executionId"], item.get("reason"))
            return answers


class _Sink:
    """``ctx.heartbeat(progress=…)``: this execution's heartbeat now, with its progress (as a direct worker stores it
    at once); liveness alone is renewed in the background."""

    def __init__(self, runtime: GatewayRuntime, running: _Running) -> None:
        self._runtime = runtime
        self._running = running

    async def heartbeat(self, ctx: Context, progress: Any | None) -> None:
        if progress is not None:
            self._running.progress = progress
            self._running.progress_pending = True
            await self._runtime.beat([self._running])


def _worker_info(worker: Worker, concurrency: int, running: int) -> dict[str, Any]:
    """What a pull says of this worker (the gateway announces it with it)."""
    return {
        "concurrency": concurrency,
        "freeSlots": max(0, concurrency - running),
        "handlers": sorted(worker.registry.names()),
        "version": _SDK_VERSION,
    }


def _deadline(text: str | None) -> float | None:
    return None if not text else datetime.fromisoformat(text).timestamp()


def _error(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback_text(exc)}
