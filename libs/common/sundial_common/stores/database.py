"""The Postgres connection pool every store shares: how connections are set up, opened, probed and closed.

One :class:`Database` per process owns the asyncpg pool; the domain stores (:mod:`~sundial_common.stores`)
each run their named queries over it. asyncpg prepares and caches every statement, so hot paths pay no
parse cost.
"""

from __future__ import annotations

from typing import cast

import asyncpg
import orjson

from sundial_common.stores.queries import load_file

Q = load_file("database.sql")


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb in binary format is a version byte followed by the JSON text; orjson does the rest.
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=lambda value: b"\x01" + orjson.dumps(value),
        decoder=lambda data: orjson.loads(data[1:]),
        format="binary",
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    # Called instead of asyncpg's default reset when a connection goes back to the pool. The default
    # runs "SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL" — a second round trip
    # after every single-statement call. Sundial sets no session state (no SET, LISTEN, advisory locks
    # or cursors outside transactions), and asyncpg still rolls back any transaction left open.
    return None


class Database:
    """One asyncpg pool, with Sundial's connection setup."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def connect(
        cls, dsn: str, *, min_size: int = 1, max_size: int = 10, max_inactive_connection_lifetime: float = 300.0
    ) -> Database:
        """``max_inactive_connection_lifetime``: seconds an unused connection stays open (0: for good)."""
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            max_inactive_connection_lifetime=max_inactive_connection_lifetime,
            init=_init_connection,
            reset=_keep_session,
            # JIT compiles, at every execution, any plan whose estimated cost passes a threshold, and the
            # estimates of batched statements (unnest()ed arrays against tables whose statistics lag their
            # growth) are guesses. Nothing Sundial runs is analytic enough to win it back.
            # Plans are made for each execution, never cached generic: a generic plan is chosen while
            # executions is nearly empty (a seq scan is then cheapest) and kept as it grows by thousands of
            # rows a second, until autovacuum's next analyze. A steady 1,000 a second measured the batched
            # start and finish at 14 ms a call (a scan of the table) instead of a few primary-key probes.
            # (The exception, fetch_every_partition: statements that prune nothing, planned generic by index.)
            server_settings={"jit": "off", "plan_cache_mode": "force_custom_plan", "random_page_cost": "1.1"},
        )
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def ping(self) -> None:
        await self.pool.fetchval(Q["ping"])

    async def fetch_every_partition(self, query: str, *args: object) -> list[asyncpg.Record]:
        """The rows of ``query``, a statement that reads every partition of ``executions`` (an open or dead-lettered
        execution may be in any day): planned once per connection, through index scans only (database.sql,
        ``every_partition_plan``), instead of planning every partition at each call."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["every_partition_plan"])
            return cast(list[asyncpg.Record], await conn.fetch(query, *args))
