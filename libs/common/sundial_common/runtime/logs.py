"""Process logging: text for people, JSON lines for machines, with Sundial's domain fields.

Pass ``extra={"tenant": …, "job_id": …, "execution_id": …, "attempt": …, "trace_id": …}`` and the
fields appear in both formats.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from typing import Any

import orjson

FIELDS = ("service", "tenant", "job_id", "execution_id", "attempt", "trace_id", "shard", "fence_token")

SERVICE: ContextVar[str | None] = ContextVar("sundial_service", default=None)
"""The service a line comes from, where one process hosts several (``sundial services``,
:mod:`sundial_common.commands.host`):
set in each hosted service's task context, so the shared code it calls (leadership, registry) is attributed too.
Unset (a process of one service) adds nothing to a line."""


class ServiceField(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "service", None) is None:
            record.service = SERVICE.get()
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            if (value := getattr(record, name, None)) is not None:
                entry[name] = str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = " ".join(f"{n}={getattr(record, n)}" for n in FIELDS if getattr(record, n, None) is not None)
        return f"{line} {extras}" if extras else line


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        formatter = _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        formatter.converter = __import__("time").gmtime
        handler.setFormatter(formatter)
    handler.addFilter(ServiceField())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
