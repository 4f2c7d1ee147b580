"""How every Sundial process reads SIGINT, SIGTERM and SIGHUP: one stop request, then maybe a deliberate force.

One Ctrl-C often arrives twice. The terminal sends SIGINT to the whole foreground process group, and a
launcher in that group (`uv run`, `make`, the dev supervisor) forwards the SIGINT it got to its child as
well — about 200 ms later under `uv run sundial worker`. Taking the second copy as "stop now, do not wait"
turned every Ctrl-C into an abandoned shutdown. So :class:`StopSignals` treats every signal within
:data:`DUPLICATE_WINDOW_SEC` of the first as the same request, and only a signal after that — a second,
deliberate Ctrl-C — as a request to force. Every process uses it: the services through
:func:`sundial_common.runtime.service.run`, the API through its uvicorn server, the dev supervisor directly.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Iterable
from types import FrameType

log = logging.getLogger(__name__)

#: Signals closer than this to the first one are copies of it (observed gap: ~0.2 s).
DUPLICATE_WINDOW_SEC = 1.0
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Turns a stream of stop signals into at most one ``on_stop`` and one ``on_force`` call.

    The first signal calls ``on_stop`` (graceful). Later signals within ``window_sec`` of the first are
    ignored as duplicates; the first one after that calls ``on_force`` (if given; otherwise it is only
    logged, and the stop stays graceful). Further signals do nothing more.
    """

    def __init__(
        self,
        on_stop: Callable[[], None],
        on_force: Callable[[], None] | None = None,
        *,
        window_sec: float = DUPLICATE_WINDOW_SEC,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_stop = on_stop
        self._on_force = on_force
        self._window_sec = window_sec
        self._clock = clock
        self._first_at: float | None = None
        self.forced = False

    @property
    def stopping(self) -> bool:
        return self._first_at is not None

    def handle(self, signum: int) -> None:
        """React to one received signal."""
        name = signal.Signals(signum).name
        now = self._clock()
        if self._first_at is None:
            self._first_at = now
            hint = " (again to force)" if self._on_force is not None else ""
            log.info("%s received; stopping gracefully%s", name, hint)
            self._on_stop()
        elif now - self._first_at < self._window_sec:
            log.info("%s received again %.2fs later: the same stop request (ignored)", name, now - self._first_at)
        elif self.forced:
            pass
        elif self._on_force is None:
            log.info("%s received again; already stopping gracefully", name)
        else:
            self.forced = True
            log.warning("%s received again; forcing the stop", name)
            self._on_force()

    def install(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        """Handle ``signals`` with ``signal.signal`` (for code that does not run an event loop)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            self.handle(signum)

        for sig in signals:
            signal.signal(sig, handler)

    def install_on(self, loop: asyncio.AbstractEventLoop, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        """Handle ``signals`` on ``loop`` (callbacks run in the loop, so they may touch asyncio objects)."""
        for sig in signals:
            loop.add_signal_handler(sig, self.handle, sig)
