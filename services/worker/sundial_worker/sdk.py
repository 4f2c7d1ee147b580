"""The worker SDK: what a tenant service imports to serve a pool.

```python
from sundial_worker import Worker

worker = Worker(pool="email-sender", concurrency=16)

@worker.handler("send_welcome")
async def send_welcome(ctx, payload: dict) -> dict | None:
    await ctx.heartbeat(progress={"sent": 10})
    if ctx.cancelled:
        ...
```

``sundial worker --app mymodule:worker`` runs it (see :mod:`sundial_worker.runtime`). A handler gets a
:class:`Context` and the job's payload; what it returns (anything JSON-able) is stored as the
execution's result. Handlers are delivered *at least once*: ``ctx.execution_id``, ``ctx.attempt`` and
``ctx.fence_token`` are what a handler dedupes its side effects with (DESIGN invariant 5).

Async handlers run on the worker's event loop; plain functions run in a thread pool, which is the
one sync→async bridge in Sundial.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar
from uuid import UUID

from sundial_common.broker.messages import POOL_NAME

from sundial_worker.log_tail import TailingLogger

log = logging.getLogger("sundial.worker")

# What a handler may be: ``async def h(ctx, payload)`` or ``def h(ctx, payload)``.
HandlerFunc = Callable[["Context", Any], Any]
F = TypeVar("F", bound=HandlerFunc)

_MAX_HANDLER_NAME = 200
DEFAULT_CONCURRENCY = 16


class HeartbeatSink(Protocol):
    """Where ``ctx.heartbeat`` goes: the runtime renews liveness and stores progress."""

    async def heartbeat(self, ctx: Context, progress: Any | None) -> None: ...


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler: its name in the pool, the function, and how it must be called."""

    name: str
    func: HandlerFunc
    is_async: bool

    @property
    def qualname(self) -> str:
        module = getattr(self.func, "__module__", None) or "?"
        return f"{module}.{getattr(self.func, '__qualname__', repr(self.func))}"


def _is_async(func: HandlerFunc) -> bool:
    # A callable object with ``async def __call__`` is async too; functools.partial is unwrapped by inspect.
    call = getattr(func, "__call__", None)  # noqa: B004 - we need the bound __call__, not callable()
    return inspect.iscoroutinefunction(func) or (call is not None and inspect.iscoroutinefunction(call))


def validate_handler_name(name: object) -> None:
    if not isinstance(name, str) or not name or name != name.strip() or len(name) > _MAX_HANDLER_NAME:
        raise ValueError(
            "handler name must be a non-empty string without surrounding whitespace, at most "
            f"{_MAX_HANDLER_NAME} characters; got {name!r}"
        )


class HandlerRegistry:
    """Handler names → functions for one pool; a name is registered once."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._handlers: dict[str, HandlerSpec] = {}

    def register(self, name: str, func: HandlerFunc) -> HandlerSpec:
        validate_handler_name(name)
        if not callable(func):
            raise TypeError(f"handler {name!r} must be a function taking (ctx, payload); got {func!r}")
        if (existing := self._handlers.get(name)) is not None:
            raise ValueError(
                f"handler {name!r} is already registered on pool {self.pool!r} (by {existing.qualname}); "
                "each handler name maps to exactly one function"
            )
        spec = HandlerSpec(name=name, func=func, is_async=_is_async(func))
        self._handlers[name] = spec
        return spec

    def get(self, name: str) -> HandlerSpec | None:
        return self._handlers.get(name)

    def specs(self) -> dict[str, HandlerSpec]:
        return dict(self._handlers)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def __iter__(self) -> Iterator[str]:
        return iter(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)

    def unknown_handler_error(self, name: str) -> str:
        known = ", ".join(self.names()) or "none"
        return f"UnknownHandler: pool {self.pool!r} has no handler {name!r} (registered: {known})"


class Worker:
    """A pool's handlers and its default concurrency. Building it does no I/O."""

    def __init__(self, pool: str, *, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        if not isinstance(pool, str) or not POOL_NAME.fullmatch(pool):
            raise ValueError(
                f"invalid pool name {pool!r}: use 1-63 characters of lowercase letters, digits, '.', '_' "
                "or '-', starting with a letter or digit (it names the Kafka topic sundial.pool.<pool>)"
            )
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer; got {concurrency!r}")
        self.pool = pool
        self.concurrency = concurrency
        self.registry = HandlerRegistry(pool)

    def handler(self, name: str) -> Callable[[F], F]:
        """Register the decorated function as the handler ``name`` of this pool."""
        if callable(name):
            raise TypeError("@worker.handler needs the handler's name: write @worker.handler('send_welcome')")
        validate_handler_name(name)  # fail at the decorator line, not later when a message arrives

        def register(func: F) -> F:
            self.registry.register(name, func)
            return func

        return register

    def for_pool(self, pool: str) -> Worker:
        """The same handlers serving ``pool`` — e.g. ``worker.for_pool("staging-email")`` runs replays of
        ``email`` in its staging pool (``ctx.replay`` tells a handler so)."""
        copy = Worker(pool, concurrency=self.concurrency)
        for name, spec in self.registry.specs().items():
            copy.registry.register(name, spec.func)
        return copy

    @property
    def handlers(self) -> Mapping[str, HandlerSpec]:
        return self.registry.specs()

    def __repr__(self) -> str:
        return f"Worker(pool={self.pool!r}, concurrency={self.concurrency}, handlers={self.registry.names()})"


@dataclass(frozen=True, slots=True)
class ReplayInfo:
    """What ``ctx.replay`` says in a staging pool: this run replays a production message, not a new execution.

    Its outcome is recorded per replay (``GET /v1/replays/{id}/runs``), never as an execution; a handler with
    side effects outside staging should check ``ctx.replay`` and keep them there.
    """

    replay_id: UUID
    #: The production execution whose message this is (also ``ctx.execution_id``).
    original_execution_id: UUID
    source_topic: str
    source_partition: int
    source_offset: int
    #: When the original message reached the broker.
    published_at: datetime


@dataclass(eq=False)
class Context:
    """What a handler knows about the execution it runs, and how it talks back to Sundial.

    ``execution_id``, ``attempt`` and ``fence_token`` identify this delivery; use them as the dedup key
    of any side effect (a redelivered or retried execution has the same id, a later attempt a higher
    ``attempt``). ``logger`` carries tenant/job/execution/attempt/trace fields on every line.
    """

    execution_id: UUID
    job_id: UUID
    tenant: str
    attempt: int
    fence_token: int
    scheduled_for: datetime
    handler: str
    pool: str
    trace_id: str | None
    logger: logging.LoggerAdapter[logging.Logger]
    # The last progress an earlier attempt of this execution checkpointed (ctx.heartbeat(progress=…)), so a
    # retry can resume a long job instead of starting over; None on a first attempt or without checkpoints.
    previous_progress: Any | None = None
    # The last progress this attempt reported through heartbeat().
    progress: Any | None = None
    # Set in a staging pool: the replay and original message this run replays (see ReplayInfo); None otherwise.
    replay: ReplayInfo | None = None
    # The job's ``timeoutSec`` (None: none): the attempt is interrupted that long after it started.
    timeout_sec: float | None = None
    _sink: HeartbeatSink | None = field(default=None, repr=False)
    _cancel_requested: bool = field(default=False, repr=False)

    async def heartbeat(self, progress: Any | None = None) -> None:
        """Renew this execution's liveness now and, if ``progress`` is given, store it on the attempt.

        Progress is any JSON-able value; the latest one is what a retry will resume from. Liveness is
        also renewed in the background while the handler runs, so calling this is only needed to
        checkpoint progress.
        """
        if progress is not None:
            self.progress = progress
        if self._sink is not None:
            await self._sink.heartbeat(self, progress)

    @property
    def cancelled(self) -> bool:
        """True once the attempt is being stopped: its execution's cancel was requested, or it reached its
        timeout. An async handler's task is cancelled at the same moment; a sync handler must check this flag
        (its thread cannot be interrupted) and return within the cancel grace, or it is abandoned."""
        return self._cancel_requested

    def request_cancel(self) -> None:
        """Called by the runtime when it learns of a cancel; handlers only read :attr:`cancelled`."""
        self._cancel_requested = True


def context_logger(
    logger: logging.Logger,
    *,
    tenant: str,
    job_id: UUID,
    execution_id: UUID,
    attempt: int,
    trace_id: str | None,
) -> logging.LoggerAdapter[logging.Logger]:
    """A logger adapter carrying the structured log fields (tenant, job, execution, attempt, trace), which keeps the
    attempt's last lines (:mod:`~sundial_worker.log_tail`: they are stored with the attempt)."""
    return TailingLogger(
        logger,
        {
            "tenant": tenant,
            "job_id": str(job_id),
            "execution_id": str(execution_id),
            "attempt": attempt,
            "trace_id": trace_id,
        },
    )
