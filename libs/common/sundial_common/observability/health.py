"""Liveness and readiness of a process: is its event loop turning, and did its loops' last passes succeed?

Every Sundial process answers two probes on its metrics port (:mod:`sundial_common.observability.probes`):

- **liveness** (``/healthz``) fails when the process is stuck and only a restart helps: its event loop did not
  run a callback within ``loop_timeout_sec`` (something blocks it), or a loop's pass has been running for
  longer than that loop's ``stuck_after_sec`` (an await that never returns).
- **readiness** (``/readyz``) fails while the process cannot do its work: the last pass of one of its loops
  raised (so a dependency that pass needs — Postgres, Redis, etcd, the broker — is unreachable or refusing),
  or a readiness condition the process registered answers a reason (:meth:`Health.require`).

A standby replica, which runs no loop until it leads, is ready: it is doing what it should. The state is
process-wide (:data:`HEALTH`), fed by :func:`sundial_common.runtime.service.every` for every loop it drives
and by :func:`sundial_common.runtime.service.run` for the event loop, so a process gets both probes without
code of its own. Reads come from the probe server's thread; writes from the event loop: each field is a
single assignment, which the probe reads as a whole.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: How long a pass may run before the process counts as stuck, unless the loop says otherwise.
DEFAULT_STUCK_AFTER_SEC = 300.0


@dataclass
class LoopHealth:
    """What the probes know of one loop: when its pass started and ended, and how the last one went."""

    name: str
    stuck_after_sec: float = DEFAULT_STUCK_AFTER_SEC
    pass_started: float | None = None
    last_error: str | None = None
    passes: int = 0

    def starting(self) -> None:
        self.pass_started = time.monotonic()

    def passed(self) -> None:
        self.pass_started = None
        self.last_error = None
        self.passes += 1

    def failed(self, error: BaseException) -> None:
        self.pass_started = None
        self.last_error = f"{type(error).__name__}: {error}"[:200]
        self.passes += 1


@dataclass
class Health:
    """The process's probe state: its loops, its event loop, and the readiness conditions it registered."""

    loop_timeout_sec: float = 5.0
    loops: dict[str, LoopHealth] = field(default_factory=dict)
    conditions: dict[str, Callable[[], str | None]] = field(default_factory=dict)
    event_loop: asyncio.AbstractEventLoop | None = None

    def loop(self, name: str, stuck_after_sec: float = DEFAULT_STUCK_AFTER_SEC) -> LoopHealth:
        """Register (or find again) the loop ``name``; :meth:`forget` it when the loop ends."""
        health = self.loops.get(name)
        if health is None:
            health = self.loops[name] = LoopHealth(name, stuck_after_sec)
        return health

    def forget(self, name: str) -> None:
        self.loops.pop(name, None)

    def require(self, name: str, condition: Callable[[], str | None]) -> None:
        """Add a readiness condition: ``condition()`` answers ``None`` when ready, else why not (cheap, sync)."""
        self.conditions[name] = condition

    def watch(self, event_loop: asyncio.AbstractEventLoop) -> None:
        """Check ``event_loop`` on every liveness probe (set by the process's ``run``)."""
        self.event_loop = event_loop

    def liveness(self) -> list[str]:
        """Why the process is not alive (empty when it is). Called from another thread than the event loop's."""
        problems = []
        if self.event_loop is not None and not self.event_loop.is_closed() and not self._loop_answers():
            problems.append(f"event loop: no callback ran within {self.loop_timeout_sec:g} s")
        now = time.monotonic()
        for loop in list(self.loops.values()):
            started = loop.pass_started
            if started is not None and now - started > loop.stuck_after_sec:
                problems.append(f"{loop.name}: pass running for {now - started:.0f} s")
        return problems

    def readiness(self) -> list[str]:
        """Why the process is not ready (empty when it is)."""
        problems = [
            f"{loop.name}: last pass failed: {loop.last_error}"
            for loop in list(self.loops.values())
            if loop.last_error is not None
        ]
        for name, condition in list(self.conditions.items()):
            try:
                reason = condition()
            except Exception as exc:  # a condition that raises says "not ready", never breaks the probe
                reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                problems.append(f"{name}: {reason}")
        return problems

    def _loop_answers(self) -> bool:
        assert self.event_loop is not None
        answered = threading.Event()
        try:
            self.event_loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # closed between the check and the call: the process is on its way out
            return True
        return answered.wait(self.loop_timeout_sec)


#: The process's one probe state.
HEALTH = Health()
