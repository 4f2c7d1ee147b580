"""The notifications store: tenants' webhook subscriptions, the incidents they are told about, and deliveries.

Whoever notices an event (the sweeper) records it with :meth:`NotificationStore.record_incidents`: one row per
incident under a unique key, and in the same statement one delivery per matching subscription, so a failover
half-way through a pass records nothing twice. Whoever holds the tenants' keys (the API replicas) claims due
deliveries (:meth:`~NotificationStore.claim_due`, a lease per row, under caps per tenant and per destination,
one replica's claim at a time), sends them and finishes each
with a compare-and-swap on its attempt number. SQL: ``sql/notifications.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast
from uuid import UUID

import asyncpg

from sundial_common.domain.ids import new_id
from sundial_common.stores.database import Database
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("notifications.sql")

#: The events a subscription may name, and what each means.
EVENTS: dict[str, str] = {
    "execution.dead": "an execution failed its last attempt (or was given up) and is DEAD",
    "execution.late": "an occurrence not started within the grace after its due time (no dispatcher made it, or "
    "no worker started it)",
    "execution.failing": "a job's occurrence ended DEAD after its previous one had SUCCEEDED (the first failure "
    "after a success; the failures after it are not told again)",
    "execution.recovered": "a job's occurrence SUCCEEDED after its previous one had ended DEAD (the first success "
    "after a failure)",
    "breaker.opened": "a handler's retry circuit breaker opened: its retries are held",
    "breaker.closed": "a handler's retry circuit breaker closed again: its held retries are released",
    "backfill.finished": "a backfill walked its range (or was cancelled) and every execution it made has ended; "
    "with their outcome counts",
    "replay.finished": "a replay into a staging pool SUCCEEDED, FAILED or was CANCELLED; with its counts",
    "bulk.finished": "a bulk operation SUCCEEDED, FAILED or was CANCELLED; with its outcome counts",
    "pool.unserved": "a pool has work (PENDING executions of the tenant) and no live worker: once per episode",
    "pool.served": "a worker of a pool that had work and no live worker is live again: the episode is over",
}
POOL_UNSERVED = "pool.unserved"
POOL_SERVED = "pool.served"
#: A delivery's states: PENDING until the receiver answers 2xx (DELIVERED) or the attempts run out (FAILED);
#: CANCELLED when its subscription is deleted first.
DELIVERY_STATES = ("PENDING", "DELIVERED", "FAILED", "CANCELLED")


@dataclass(frozen=True, slots=True)
class NewSubscription:
    tenant_id: str
    created_by: str
    events: tuple[str, ...]
    url: str
    sealed_secrets: Any  # the tenant cipher's sealed JSON list of secrets
    pool: str | None = None
    job_id: UUID | None = None
    description: str | None = None
    #: An e-mail subscription's (``url`` is ``mailto:…``): the SHA-256 of its confirmation link's token.
    email_token_digest: bytes | None = None
    #: The destination an administrator allowed this tenant (scheme://host:port) and its addresses, if it is one.
    allowed_origin: str | None = None
    allowed_addresses: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Incident:
    """Something a subscription may be told about; ``incident_key`` names it once and for all."""

    tenant_id: str
    event: str
    incident_key: str
    pool: str | None = None
    job_id: str | None = None
    execution_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeliveryCaps:
    """How many attempts a tenant, and a destination (a subscription's URL), may have in flight at once
    (``*_concurrency``) and may have sent in the last minute (``*_per_minute``), across every API replica."""

    tenant_concurrency: int = 20
    destination_concurrency: int = 4
    tenant_per_minute: int = 600
    destination_per_minute: int = 120
    #: Due deliveries looked at per claim, oldest first: the capped ones are skipped over for others.
    scan: int = 1000

    def __post_init__(self) -> None:
        if min(asdict(self).values()) < 1:
            raise ValueError("every delivery cap must be >= 1")


class NotificationStore(Protocol):
    async def create_subscription(self, subscription: NewSubscription) -> Record: ...

    async def list_subscriptions(self, tenant: str) -> list[Record]: ...

    async def get_subscription(self, subscription_id: UUID, tenant: str) -> Record | None: ...

    async def delete_subscription(self, subscription_id: UUID, tenant: str) -> bool: ...

    async def confirm_email(self, token_digest: bytes) -> Record | None:
        """Confirm the address of the e-mail subscription whose link's token digests to ``token_digest``."""
        ...

    async def allow_destination(self, tenant: str, origin: str, addresses: Sequence[str], actor: str) -> Record: ...

    async def allowed_destination(self, tenant: str, origin: str) -> Record | None: ...

    async def allowed_destinations(self, tenant: str | None) -> list[Record]: ...

    async def revoke_destination(self, tenant: str, origin: str) -> bool:
        """Withdraw an allowance, from the subscriptions made under it too; False when there was none."""
        ...

    async def rotate_secret(
        self, subscription_id: UUID, tenant: str, sealed_before: Any, sealed_after: Any, previous_valid_sec: float
    ) -> Record | None:
        """Replace the secrets if they are still ``sealed_before``; the previous one signs ``previous_valid_sec``
        more seconds. None: no such subscription, or another rotation came first."""
        ...

    async def record_incidents(self, incidents: Sequence[Incident]) -> tuple[int, int]:
        """(new incidents, deliveries made): incidents nobody subscribed to, or recorded before, count nothing."""
        ...

    async def late_starts(self, grace_sec: float, limit: int) -> list[Record]:
        """Occurrences not started ``grace_sec`` after they were due, of tenants subscribed to ``execution.late``."""
        ...

    async def last_outcomes(self, after_job: UUID, limit: int) -> list[Record]:
        """Jobs (by id, after ``after_job``, ``limit`` of them) of the tenants subscribed to ``execution.failing``
        or ``execution.recovered``, each with its latest finished occurrence and the one before it."""
        ...

    async def finished_operations(self, lookback_sec: float, limit: int) -> list[Record]:
        """Backfills, replays and bulk operations finished within ``lookback_sec`` with no incident yet, of the
        tenants subscribed to their event (``limit`` of each kind)."""
        ...

    async def pool_backlogs(self) -> list[Record]:
        """(tenant, pool, pending, open) of the tenants subscribed to ``pool.unserved`` or ``pool.served``: every
        pool with work waiting, and every pool whose episode is open."""
        ...

    async def open_pool_episode(self, tenant: str, pool: str, detail: dict[str, Any]) -> int | None:
        """Open an episode of (``tenant``, ``pool``) and record its ``pool.unserved`` incident, in one
        transaction; its number, or None when one was open already."""
        ...

    async def close_pool_episode(self, tenant: str, pool: str, detail: dict[str, Any]) -> int | None:
        """Close the open episode and record its ``pool.served`` incident, in one transaction; its number, or
        None when none was open."""
        ...

    async def insert_test_delivery(self, subscription_id: UUID, tenant: str, lease_sec: float) -> UUID | None: ...

    async def claim_due(self, limit: int, lease_sec: float, caps: DeliveryCaps) -> list[Record]:
        """Claim up to ``limit`` due deliveries for ``lease_sec``, none beyond ``caps``."""
        ...

    async def delivery(self, delivery_id: UUID) -> Record | None: ...

    async def finish_delivery(
        self,
        delivery_id: UUID,
        attempt: int,
        state: str,
        status: int | None,
        error: str | None,
        retry_in_sec: float = 0.0,
    ) -> bool:
        """Record what attempt ``attempt`` came to; False when another sender's claim replaced this one."""
        ...

    async def delivery_log(self, subscription_id: UUID, tenant: str, limit: int) -> list[Record]: ...

    async def prune_incidents(self, keep_days: int, limit: int) -> int:
        """Delete up to ``limit`` incidents older than ``keep_days`` with no delivery pending; how many went."""
        ...


class PostgresNotificationStore:
    """:class:`NotificationStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_subscription(self, subscription: NewSubscription) -> Record:
        row = await self._db.pool.fetchrow(
            Q["insert_subscription"],
            new_id(),
            subscription.tenant_id,
            subscription.created_by,
            list(subscription.events),
            subscription.pool,
            subscription.job_id,
            subscription.url,
            subscription.sealed_secrets,
            subscription.description,
            subscription.email_token_digest,
            subscription.allowed_origin,
            list(subscription.allowed_addresses) if subscription.allowed_addresses is not None else None,
        )
        return cast(Record, row)

    async def allow_destination(self, tenant: str, origin: str, addresses: Sequence[str], actor: str) -> Record:
        row = await self._db.pool.fetchrow(Q["allow_destination"], tenant, origin, list(addresses), actor)
        return cast(Record, row)

    async def allowed_destination(self, tenant: str, origin: str) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["allowed_destination"], tenant, origin))

    async def allowed_destinations(self, tenant: str | None) -> list[Record]:
        return list(await self._db.pool.fetch(Q["allowed_destinations"], tenant))

    async def revoke_destination(self, tenant: str, origin: str) -> bool:
        return bool(await self._db.pool.fetchval(Q["revoke_destination"], tenant, origin))

    async def confirm_email(self, token_digest: bytes) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["confirm_email"], token_digest))

    async def list_subscriptions(self, tenant: str) -> list[Record]:
        return list(await self._db.pool.fetch(Q["list_subscriptions"], tenant))

    async def get_subscription(self, subscription_id: UUID, tenant: str) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["get_subscription"], subscription_id, tenant))

    async def delete_subscription(self, subscription_id: UUID, tenant: str) -> bool:
        return bool(await self._db.pool.fetchval(Q["delete_subscription"], subscription_id, tenant))

    async def rotate_secret(
        self, subscription_id: UUID, tenant: str, sealed_before: Any, sealed_after: Any, previous_valid_sec: float
    ) -> Record | None:
        row = await self._db.pool.fetchrow(
            Q["rotate_secret"], subscription_id, tenant, sealed_before, sealed_after, previous_valid_sec
        )
        return cast(Record | None, row)

    async def record_incidents(self, incidents: Sequence[Incident]) -> tuple[int, int]:
        async with self._db.pool.acquire() as conn:
            return await record_incidents_on(conn, incidents)

    async def late_starts(self, grace_sec: float, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["late_starts"], grace_sec, limit))

    async def last_outcomes(self, after_job: UUID, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["last_outcomes"], after_job, limit))

    async def finished_operations(self, lookback_sec: float, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["finished_operations"], lookback_sec, limit))

    async def pool_backlogs(self) -> list[Record]:
        return list(await self._db.pool.fetch(Q["pool_backlogs"]))

    async def open_pool_episode(self, tenant: str, pool: str, detail: dict[str, Any]) -> int | None:
        return await self._pool_episode("open_pool_episode", POOL_UNSERVED, tenant, pool, detail)

    async def close_pool_episode(self, tenant: str, pool: str, detail: dict[str, Any]) -> int | None:
        return await self._pool_episode("close_pool_episode", POOL_SERVED, tenant, pool, detail)

    async def _pool_episode(self, query: str, event: str, tenant: str, pool: str, detail: dict[str, Any]) -> int | None:
        async with self._db.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(Q[query], tenant, pool)
            if row is None:
                return None
            episode = int(row["episode"])
            since = row["unserved_since"]
            incident = Incident(
                tenant_id=tenant,
                event=event,
                incident_key=f"{event}:{tenant}:{pool}:{episode}",
                pool=pool,
                detail={**detail, "episode": episode, "unservedSince": since.isoformat() if since else None},
            )
            await record_incidents_on(conn, [incident])
            return episode

    async def insert_test_delivery(self, subscription_id: UUID, tenant: str, lease_sec: float) -> UUID | None:
        delivery_id = new_id()
        row = await self._db.pool.fetchrow(
            Q["insert_test_delivery"], subscription_id, tenant, new_id(), delivery_id, lease_sec
        )
        return delivery_id if row is not None else None

    async def claim_due(self, limit: int, lease_sec: float, caps: DeliveryCaps) -> list[Record]:
        async with self._db.pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["claim_lock"])
            await conn.execute(Q["forget_old_sends"])
            rows = await conn.fetch(
                Q["claim_due_deliveries"],
                limit,
                lease_sec,
                caps.tenant_concurrency,
                caps.destination_concurrency,
                caps.tenant_per_minute,
                caps.destination_per_minute,
                caps.scan,
            )
        return list(rows)

    async def delivery(self, delivery_id: UUID) -> Record | None:
        return cast(Record | None, await self._db.pool.fetchrow(Q["delivery_for_send"], delivery_id))

    async def finish_delivery(
        self,
        delivery_id: UUID,
        attempt: int,
        state: str,
        status: int | None,
        error: str | None,
        retry_in_sec: float = 0.0,
    ) -> bool:
        row = await self._db.pool.fetchrow(
            Q["finish_delivery"], delivery_id, attempt, state, status, error, retry_in_sec
        )
        return row is not None

    async def delivery_log(self, subscription_id: UUID, tenant: str, limit: int) -> list[Record]:
        return list(await self._db.pool.fetch(Q["delivery_log"], subscription_id, tenant, limit))

    async def prune_incidents(self, keep_days: int, limit: int) -> int:
        status = await self._db.pool.execute(Q["prune_incidents"], keep_days, limit)
        return int(status.split()[-1])


async def record_incidents_on(conn: asyncpg.Connection, incidents: Sequence[Incident]) -> tuple[int, int]:
    """:meth:`NotificationStore.record_incidents` on ``conn``: inside the caller's transaction, so the change
    an incident tells of and the incident commit together or not at all."""
    if not incidents:
        return 0, 0
    row = await conn.fetchrow(Q["record_incidents"], [asdict(i) for i in incidents])
    assert row is not None
    return int(row["incidents"]), int(row["deliveries"])
