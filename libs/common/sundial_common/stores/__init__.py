"""The Postgres stores: the only source of truth (DESIGN invariant 1), one store per domain.

Every database call a Sundial process makes goes through one of them, each a small ``typing.Protocol`` with
one Postgres implementation and its own file of named queries under ``sql/``:

- :mod:`~sundial_common.stores.jobs` — jobs' definitions and lifecycle; the hydrator's scans of due jobs;
- :mod:`~sundial_common.stores.executions` — executions and attempts: reads, cancels, the worker's start
  and finish, the sweeper's lost attempts and dead letters;
- :mod:`~sundial_common.stores.dispatch` — the leader's fenced dispatch of occurrences and retries, the
  retries coming due, and the execution outbox;
- :mod:`~sundial_common.stores.idempotency` — Idempotency-Key claims and responses;
- :mod:`~sundial_common.stores.replays` — replays of a pool's messages into a staging pool, their progress and
  what the staging workers ran.
- :mod:`~sundial_common.stores.analytics` — the execution-events outbox drained into ClickHouse.
- :mod:`~sundial_common.stores.partitions` — the daily partitions of executions and attempts: made ahead,
  dropped past retention.
- :mod:`~sundial_common.stores.workers` — worker incarnations and the attempts an earlier one left running.
- :mod:`~sundial_common.stores.tenants` — the tenant registry: weight, quotas, state.
- :mod:`~sundial_common.stores.keys` — tenants' wrapped data keys and the master key's check value.
- :mod:`~sundial_common.stores.dependencies` — DEPENDENT jobs' parents, and the triggers their parents' final
  states record, turned into executions by the child's shard leader;
- :mod:`~sundial_common.stores.backfills` — backfills of a recurring job's past range, stepped by its shard leader.
- :mod:`~sundial_common.stores.audit` — jobs' and executions' audit trails (the rows are written by each change's
  own statement) and execution events recorded outside a change.
- :mod:`~sundial_common.stores.pools` — the pool registry: owner or shared tenants, kind, job defaults.
- :mod:`~sundial_common.stores.pool_tokens` — the pool tokens workers behind the worker gateway hold: pool, tenant,
  revocation.
- :mod:`~sundial_common.stores.pool_targets` — where an HTTP pool's executions are POSTed, and the attempts its
  target accepted.
- :mod:`~sundial_common.stores.breakers` — retry circuit breakers per (tenant, pool, handler), their window
  counts, the retries they hold.
- :mod:`~sundial_common.stores.notifications` — tenants' webhook subscriptions, the incidents they are told
  about, and the deliveries of those.
- :mod:`~sundial_common.stores.bulk` — bulk operations: one action on every job or execution a filter selects,
  their fixed selections and each row's outcome.

They share one :class:`~sundial_common.stores.database.Database` (the asyncpg pool and its connection
setup); :class:`Stores` holds them together for a process. The values they trade in that are not one
domain's (rows, hot-window occurrences and retries) are in :mod:`~sundial_common.stores.types`. Batches are
one round trip each (arrays through ``unnest``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sundial_common.stores.analytics import AnalyticsStore, PostgresAnalyticsStore
from sundial_common.stores.audit import AuditStore, PostgresAuditStore
from sundial_common.stores.backfills import BackfillStore, PostgresBackfillStore
from sundial_common.stores.breakers import BreakerStore, PostgresBreakerStore
from sundial_common.stores.bulk import BulkStore, PostgresBulkStore
from sundial_common.stores.compatibility import check_compatible
from sundial_common.stores.database import Database
from sundial_common.stores.dependencies import DependencyStore, PostgresDependencyStore
from sundial_common.stores.dispatch import DispatchStore, PostgresDispatchStore
from sundial_common.stores.executions import ExecutionStore, PostgresExecutionStore
from sundial_common.stores.idempotency import IdempotencyStore, PostgresIdempotencyStore
from sundial_common.stores.jobs import JobStore, PostgresJobStore
from sundial_common.stores.keys import KeyStore, PostgresKeyStore
from sundial_common.stores.notifications import NotificationStore, PostgresNotificationStore
from sundial_common.stores.partitions import PartitionStore, PostgresPartitionStore
from sundial_common.stores.pool_targets import PoolTargetStore
from sundial_common.stores.pool_tokens import PoolTokenStore, PostgresPoolTokenStore
from sundial_common.stores.pools import PoolStore, PostgresPoolStore
from sundial_common.stores.replays import PostgresReplayStore, ReplayStore
from sundial_common.stores.tenants import PostgresTenantStore, TenantStore
from sundial_common.stores.workers import PostgresWorkerStore, WorkerStore


@dataclass(frozen=True, slots=True)
class Stores:
    """A process's stores, over one shared pool (``database``)."""

    database: Database
    jobs: JobStore
    executions: ExecutionStore
    dispatch: DispatchStore
    idempotency: IdempotencyStore
    replays: ReplayStore
    analytics: AnalyticsStore
    workers: WorkerStore
    tenants: TenantStore
    keys: KeyStore
    dependencies: DependencyStore
    backfills: BackfillStore
    audit: AuditStore
    pools: PoolStore
    pool_tokens: PoolTokenStore
    pool_targets: PoolTargetStore
    breakers: BreakerStore
    partitions: PartitionStore
    notifications: NotificationStore
    bulk: BulkStore

    @classmethod
    def over(cls, database: Database) -> Stores:
        """The Postgres stores over ``database``'s pool."""
        return cls(
            database=database,
            jobs=PostgresJobStore(database),
            executions=PostgresExecutionStore(database),
            dispatch=PostgresDispatchStore(database),
            idempotency=PostgresIdempotencyStore(database),
            replays=PostgresReplayStore(database),
            analytics=PostgresAnalyticsStore(database),
            workers=PostgresWorkerStore(database),
            tenants=PostgresTenantStore(database),
            keys=PostgresKeyStore(database),
            dependencies=PostgresDependencyStore(database),
            backfills=PostgresBackfillStore(database),
            audit=PostgresAuditStore(database),
            pools=PostgresPoolStore(database),
            pool_tokens=PostgresPoolTokenStore(database),
            pool_targets=PoolTargetStore(database),
            breakers=PostgresBreakerStore(database),
            partitions=PostgresPartitionStore(database),
            notifications=PostgresNotificationStore(database),
            bulk=PostgresBulkStore(database),
        )

    @classmethod
    async def connect(
        cls, dsn: str, *, min_size: int = 1, max_size: int = 10, max_inactive_connection_lifetime: float = 300.0
    ) -> Stores:
        """Open the pool (see :meth:`Database.connect`) and the stores over it, once the schema is one this code
        can run on (:func:`sundial_common.stores.compatibility.check_compatible`)."""
        database = await Database.connect(
            dsn, min_size=min_size, max_size=max_size, max_inactive_connection_lifetime=max_inactive_connection_lifetime
        )
        try:
            async with database.pool.acquire() as connection:
                await check_compatible(connection)
        except BaseException:
            await database.close()
            raise
        return cls.over(database)

    async def close(self) -> None:
        await self.database.close()
