"""What one attempt leaves behind for the person reading it: the handler's traceback and its last log lines.

``ctx.logger`` is a :class:`TailingLogger`: besides logging as usual, it keeps the last :data:`MAX_LINES` lines
(at most :data:`MAX_CHARS` characters) the attempt logged at an enabled level, which the worker stores, sealed,
with the attempt's outcome. A failed handler's traceback is kept too, its last :data:`MAX_TRACEBACK_CHARS`
characters (the innermost frames, where it went wrong). Both are read by ``GET /v1/executions/{id}``
(``attempts[].traceback``, ``attempts[].logTail``), so why an execution failed needs no access to the worker's log.
Nothing is kept by an attempt that logs nothing: the deque is made at the first line.
"""

from __future__ import annotations

import logging
import sys
import sysconfig
import threading
import traceback
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["MAX_CHARS", "MAX_LINES", "MAX_TRACEBACK_CHARS", "TailingLogger", "log_tail", "traceback_text"]

MAX_LINES = 200
MAX_CHARS = 32 * 1024
MAX_TRACEBACK_CHARS = 16 * 1024
#: Where the frames above a handler's come from: this package (the runtime awaiting it) and the standard library
#: (the thread pool and contextvars running a sync handler).
_NOT_THE_HANDLER = (str(Path(__file__).parent), sysconfig.get_paths()["stdlib"])
#: One line longer than this is cut (a payload dumped into a log line would otherwise push out every other line).
MAX_LINE_CHARS = 2000
#: Guards every attempt's kept lines (a sync handler logs from its thread). One for all: a lock made per attempt was
#: most of what an attempt that logs nothing paid here (py-spy, a steady 2,500/s), and only lines logged contend.
_LINES_LOCK = threading.Lock()


class TailingLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger adapter with structured fields that also keeps the last lines logged through it."""

    def __init__(self, logger: logging.Logger, extra: Mapping[str, object]) -> None:
        super().__init__(logger, extra)
        self._lines: deque[str] | None = None
        self._chars = 0

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if self.isEnabledFor(level):
            self._keep(level, msg, args, kwargs.get("exc_info"))
        super().log(level, msg, *args, **kwargs)

    def text(self) -> str | None:
        """The lines kept, oldest first, one per line; None if the attempt logged nothing."""
        if self._lines is None:  # nothing logged (the common case): no lock to take
            return None
        with _LINES_LOCK:
            return "\n".join(self._lines) if self._lines else None

    def _keep(self, level: int, msg: object, args: tuple[object, ...], exc_info: object) -> None:
        try:
            message = str(msg) % args if args else str(msg)
        except (TypeError, ValueError):
            message = f"{msg} {args}"
        if exc_info:
            error = sys.exc_info()[1] if exc_info is True else exc_info
            if isinstance(error, tuple):
                error = error[1]
            if isinstance(error, BaseException) and (said := f"{type(error).__name__}: {error}") not in message:
                message += f" ({said})"
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        line = f"{stamp} {logging.getLevelName(level)} {message}".replace("\x00", "\\0")
        if len(line) > MAX_LINE_CHARS:
            line = line[: MAX_LINE_CHARS - 1] + "…"
        with _LINES_LOCK:
            if self._lines is None:
                self._lines = deque()
            self._lines.append(line)
            self._chars += len(line) + 1
            while len(self._lines) > MAX_LINES or self._chars > MAX_CHARS:
                self._chars -= len(self._lines.popleft()) + 1


def log_tail(logger: logging.LoggerAdapter[logging.Logger]) -> str | None:
    """What ``logger`` kept of the attempt's log (None for an adapter that keeps nothing)."""
    return logger.text() if isinstance(logger, TailingLogger) else None


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, from the handler's first frame (not the runtime's, nor the thread
    pool's that ran a sync handler), its last :data:`MAX_TRACEBACK_CHARS` characters, NUL-free."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _outside_the_handler(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb)).replace("\x00", "\\0")
    return text if len(text) <= MAX_TRACEBACK_CHARS else "…" + text[-(MAX_TRACEBACK_CHARS - 1) :]


def _outside_the_handler(filename: str) -> bool:
    installed = "site-packages" in filename or "dist-packages" in filename  # a tenant's code may live there
    return filename.startswith(_NOT_THE_HANDLER[0]) or (filename.startswith(_NOT_THE_HANDLER[1]) and not installed)
