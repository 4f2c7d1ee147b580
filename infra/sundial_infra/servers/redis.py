"""Redis: ``redis-server`` without persistence, so every start is an empty Redis."""

from __future__ import annotations

import shutil
import socket

from sundial_infra.process import MARKER_VAR
from sundial_infra.servers.base import Server


class RedisServer(Server):
    """``redis-server`` without persistence: every start is an empty Redis (Postgres is the truth)."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _prepare(self) -> None:
        super()._prepare()
        # Never reload an old snapshot: a restart must give an empty Redis (DESIGN invariant 1).
        (self.data_dir / "dump.rdb").unlink(missing_ok=True)

    def _command(self) -> list[str]:
        return [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            # Redis overwrites its environment with its process title; keep the marker in the title.
            "--proc-title-template",
            f"{{title}} {{listen-addr}} {MARKER_VAR}={self._marker_value}",
        ]

    def _probe(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False
