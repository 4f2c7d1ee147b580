"""The ClickHouse replica: its two tables, the batched insert of lifecycle events, and the history queries.

One code path serves both modes through clickhouse-connect: a ClickHouse server (``SUNDIAL_CLICKHOUSE_URL``)
over HTTP, or the embedded engine chDB (``interface='chdb'``) in this process, on a data directory only this
process may open. That is why the analytics service, not the API, answers the stats queries: it owns the
engine, and with a server it is the same path.

clickhouse-connect's chDB client is synchronous (its async client does not support chDB), so every call
runs in a worker thread, one at a time (a lock: one chDB handle is not meant for concurrent statements).

SQL: ``sql/clickhouse.sql``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse
from uuid import UUID

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from sundial_common.stores.queries import load

Q = load(files("sundial_analytics").joinpath("sql", "clickhouse.sql").read_text())

_NAMES = re.compile(r"\{(\w+)\}")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

#: The columns of ``execution_events`` as the ingester fills them (``executions`` is filled from them by a
#: materialized view: ``event_id`` as ``version``, ``at`` as ``updated_at``, ``kind`` as its latest event's).
EVENT_COLUMNS = (
    "event_id",
    "at",
    "kind",
    "tenant_id",
    "job_id",
    "execution_id",
    "attempt",
    "state",
    "pool",
    "handler",
    "scheduled_for",
    "fire_at",
    "created_at",
    "started_at",
    "finished_at",
    "lateness_ms",
    "duration_ms",
    "worker_id",
    "error_class",
)

#: ``interval`` → the bucketing function; ``groupBy`` → the column (None: one group).
BUCKETS: Mapping[str, str] = {"hour": "toStartOfHour", "day": "toStartOfDay"}
GROUPS: Mapping[str | None, str] = {None: "''", "state": "state", "pool": "pool", "handler": "handler"}


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """Where the replica lives and how long it keeps history.

    ``url``: a ClickHouse server (``http://user:password@host:8123``); None = embedded chDB at ``chdb_path``.
    ``ttl_days``: rows older than this (by nominal time) are dropped by ClickHouse's TTL.
    """

    url: str | None
    chdb_path: Path
    database: str = "sundial"
    ttl_days: int = 400

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.database):
            raise ValueError(f"ClickHouse database name {self.database!r} must be a plain identifier")
        if self.ttl_days < 1:
            raise ValueError("ttl_days must be at least 1")


class Replica(Protocol):
    """The analytics replica of executions, whatever engine holds it."""

    async def ensure_schema(self) -> None: ...

    async def insert(self, rows: bytes) -> None:
        """Insert event rows: tab-separated text, a line each, in :data:`EVENT_COLUMNS` order (idempotent:
        re-sent rows collapse)."""
        ...

    async def execution_stats(
        self, tenant: str, start: datetime, end: datetime, interval: str, group_by: str | None
    ) -> list[dict[str, Any]]: ...

    async def handler_stats(self, tenant: str, start: datetime, end: datetime) -> list[dict[str, Any]]: ...

    async def state_counts(self) -> list[dict[str, Any]]: ...

    async def find_execution(self, tenant: str, execution_id: UUID) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


#: Start-up settings of the embedded engine (see :meth:`ClickHouseReplica._connect`).
_CHDB_OPTIONS = {"memory_worker_period_ms": 1000}


class ClickHouseReplica:
    """:class:`Replica` over clickhouse-connect: a ClickHouse server or the embedded chDB engine."""

    def __init__(self, config: ReplicaConfig) -> None:
        self.config = config
        self._db = config.database
        self._lock = threading.Lock()
        self._client: Client | None = None

    def _connect(self) -> Client:
        if self._client is None:
            if self.config.url:
                # clickhouse-connect reads host, port, user and database from the DSN but not the scheme.
                scheme = urlparse(self.config.url).scheme
                interface = scheme if scheme in ("http", "https") else None
                self._client = clickhouse_connect.get_client(dsn=self.config.url, interface=interface)
            else:
                self.config.chdb_path.mkdir(parents=True, exist_ok=True)
                # The engine's MemoryWorker thread re-reads the process's memory every 50-100 ms by default: 18
                # wake-ups a second, 0.0025 of a core of an idle replica. Once a second is plenty for a replica
                # this size (it only corrects the memory tracker and purges freed pages under memory pressure).
                self._client = clickhouse_connect.get_client(
                    interface="chdb", path=str(self.config.chdb_path), chdb_options=_CHDB_OPTIONS
                )
        return self._client

    async def _call(self, fn: Any, *args: Any) -> Any:
        def locked() -> Any:
            with self._lock:
                return fn(self._connect(), *args)

        return await asyncio.to_thread(locked)

    def _sql(self, name: str, **names: object) -> str:
        # Only these bare {names} are ours; {name:Type} is a ClickHouse server-side parameter.
        values = {"db": self._db, "ttl_days": self.config.ttl_days, **names}
        return _NAMES.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), Q[name])

    async def ensure_schema(self) -> None:
        def create(client: Client) -> None:
            client.command(self._sql("create_database"))
            client.command(self._sql("create_events"))
            client.command(self._sql("create_executions"))
            client.command(self._sql("create_executions_view"))
            # A changed retention applies to the tables that exist (only when it changed: MODIFY TTL
            # re-evaluates every part).
            wanted = f"INTERVAL {self.config.ttl_days} DAY"
            columns = {"execution_events": "at", "executions": "scheduled_for"}
            for table, query in client.query(self._sql("table_ttl"), parameters={"db_name": self._db}).result_rows:
                if table in columns and wanted not in query:
                    client.command(self._sql("modify_ttl", table=table, column=columns[table]))

        await self._call(create)

    async def insert(self, rows: bytes) -> None:
        if not rows:
            return

        # As text ClickHouse parses (in C++): clickhouse-connect's Native serialization converted each value in
        # Python (a datetime's ticks, a UUID's halves), the largest part of the service's CPU.
        def insert(client: Client) -> None:
            client.raw_insert(f"{self._db}.execution_events", EVENT_COLUMNS, rows, fmt="TabSeparated")

        await self._call(insert)

    async def _rows(self, sql: str, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
        def query(client: Client) -> list[dict[str, Any]]:
            result = client.query(sql, parameters=dict(parameters))
            return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]

        rows: list[dict[str, Any]] = await self._call(query)
        return rows

    async def execution_stats(
        self, tenant: str, start: datetime, end: datetime, interval: str, group_by: str | None
    ) -> list[dict[str, Any]]:
        sql = self._sql("execution_stats", bucket=BUCKETS[interval], group=GROUPS[group_by])
        return await self._rows(sql, {"tenant": tenant, "start": start, "end": end})

    async def handler_stats(self, tenant: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
        return await self._rows(self._sql("handler_stats"), {"tenant": tenant, "start": start, "end": end})

    async def state_counts(self) -> list[dict[str, Any]]:
        return await self._rows(self._sql("state_counts"), {})

    async def find_execution(self, tenant: str, execution_id: UUID) -> dict[str, Any] | None:
        rows = await self._rows(self._sql("find_execution"), {"tenant": tenant, "execution_id": execution_id})
        return rows[0] if rows else None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
