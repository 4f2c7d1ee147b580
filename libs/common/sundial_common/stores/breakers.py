"""The breaker store: the retry circuit breaker of each (tenant, pool, handler), its settings, its window
counts, and the retries breakers hold.

A breaker is a row of ``breakers`` (migration 0016): Postgres is its truth, so every dispatcher leader and the
sweeper see the same state and a leader change neither releases held retries early nor loses them.

- **Settings** (:class:`BreakerSettings`): process defaults (the sweeper's ``SUNDIAL_BREAKER_*``), overridden
  per tenant by ``tenants.breaker`` (the admin tenants API's ``breaker`` object); a job may opt out with
  ``breaker.enabled = false`` (``jobs.breaker``): its retries are never held.
- **The window**: a trigger on ``executions`` counts every finished attempt per handler and second in
  ``breaker_counts``; :meth:`BreakerStore.window_counts` reads them for the breaker loop.
- **Holding** happens in the dispatcher's fenced retry transaction (:func:`gate_retries`): a claimed retry
  whose breaker is OPEN — or HALF_OPEN with its probes already sent — keeps its failed state and attempt
  number; its ``next_attempt_at`` moves to the breaker's next probe (plus jitter) and ``held_by`` names the
  breaker. Held retries are never attempted, never counted as attempts, and never lost: they are ordinary
  scheduled retries the hydrator and the overdue scan know.
- **A bound on holding**: an execution held longer than ``maxHoldSec`` (its job's ``breaker.maxHoldSec``, else
  its tenant's) since a breaker first held it is not held again when its retry comes due: the gate ends that
  attempt without running it (error ``BreakerHeld``, counted as a failed attempt of the execution but not in the
  breaker's window), DEAD if it was the last. A held retry is scheduled no later than its bound, so it is
  judged then, not a cool-down later: a handler that stays broken fills the dead-letter queue within
  ``maxHoldSec`` plus its backoff, and no call reaches a downstream that is still down.
- **Transitions** (:meth:`BreakerStore.transition`) are compare-and-sets on the breaker's version that write
  their audit row in the same statement, and in the same transaction the notification incident of a move out
  of or back to CLOSED (:func:`breaker_incident`), whoever made it (the sweeper's loop or an operator): the move
  and its incident commit together, so a process killed between the two cannot lose the notification; closing
  releases the held retries spread over a window (:meth:`BreakerStore.release_held`).

SQL: ``sql/breakers.sql``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, cast
from uuid import UUID

import asyncpg

from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.stores.database import Database
from sundial_common.stores.notifications import Incident, record_incidents_on
from sundial_common.stores.queries import load_file
from sundial_common.stores.types import Record

Q = load_file("breakers.sql")

CLOSED = "CLOSED"
OPEN = "OPEN"
HALF_OPEN = "HALF_OPEN"
STATES = (CLOSED, HALF_OPEN, OPEN)
#: ``sundial_breaker_state``'s value for each state.
STATE_VALUES: Mapping[str, int] = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}

#: Seconds of jitter spread over the held retries coming due at a probe time.
HOLD_JITTER_SEC = 2.0
#: The largest ``maxHoldSec`` (a week).
MAX_HOLD_SEC = 604_800
BREAKER_OPENED = "breaker.opened"
BREAKER_CLOSED = "breaker.closed"
#: Who the audit log and the attempt row name for an attempt a breaker ended without running.
HOLD_ACTOR = "breaker"


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """When a breaker opens and how it recovers. Validated at construction (``ValueError`` names the field)."""

    enabled: bool = True
    #: Opens when failures / attempts in the window reach this (0 < ratio ≤ 1) ...
    failure_ratio: float = 0.5
    #: ... and the window holds at least this many finished attempts.
    min_attempts: int = 20
    #: The sliding window, seconds.
    window_sec: float = 60.0
    #: Open this long before the first probes; doubled on each re-open, up to ``max_cooldown_sec`` — two minutes by
    #: default: a handler that recovered is found within two minutes, and a handler still down meets only
    #: ``probes`` calls per cool-down (ten in two minutes is nothing to a downstream that is down).
    cooldown_sec: float = 30.0
    max_cooldown_sec: float = 120.0
    #: Half-open lets this many calls through and judges them as a window: their failure ratio below
    #: ``failure_ratio`` closes the breaker, at or above it re-opens it (a flaky handler is not a dead one).
    probes: int = 10
    #: Closing releases the held retries at random over this many seconds.
    release_spread_sec: float = 30.0
    #: The longest a retry is held before its attempt ends without running (``BreakerHeld``); a job may set its own.
    max_hold_sec: float = 3600.0

    def __post_init__(self) -> None:
        def bad(name: str, message: str) -> ValueError:
            return ValueError(f"{_camel(name)} {message}")

        if not 0 < self.failure_ratio <= 1:
            raise bad("failure_ratio", "must be above 0 and at most 1")
        if not 1 <= self.min_attempts <= 1_000_000:
            raise bad("min_attempts", "must be between 1 and 1000000")
        if not 1 <= self.window_sec <= 3600:
            raise bad("window_sec", "must be between 1 and 3600 seconds")
        if not 1 <= self.cooldown_sec <= 86400:
            raise bad("cooldown_sec", "must be between 1 and 86400 seconds")
        if not self.cooldown_sec <= self.max_cooldown_sec <= 86400:
            raise bad("max_cooldown_sec", "must be at least cooldownSec and at most 86400 seconds")
        if not 1 <= self.probes <= 100:
            raise bad("probes", "must be between 1 and 100")
        if not 0 <= self.release_spread_sec <= 3600:
            raise bad("release_spread_sec", "must be between 0 and 3600 seconds")
        if not 1 <= self.max_hold_sec <= MAX_HOLD_SEC:
            raise bad("max_hold_sec", f"must be between 1 and {MAX_HOLD_SEC} seconds")

    def merged(self, overrides: Mapping[str, Any] | None) -> BreakerSettings:
        """These settings with a tenant's overrides (camelCase keys, as stored from the API) applied."""
        if not overrides:
            return self
        names = {_camel(f.name): f.name for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{names[k]: v for k, v in overrides.items() if k in names and v is not None})

    def as_overrides(self) -> dict[str, Any]:
        return {_camel(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(BreakerSettings))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@dataclass(frozen=True, slots=True)
class Breaker:
    id: UUID
    tenant_id: str
    pool: str
    handler: str
    state: str
    #: Where the current state's counting starts ...
    since: datetime
    #: ... less what the bucket of that second already held then.
    since_attempts: int
    since_failures: int
    #: The window's finished attempts and failures, as last evaluated.
    attempts: int
    failures: int
    opened_at: datetime | None
    next_probe_at: datetime | None
    cooldown_sec: float
    probe_limit: int
    probes_sent: int
    opens: int
    manual: bool
    version: int
    updated_at: datetime
    #: How long it may hold a retry (its tenant's ``maxHoldSec`` when the sweeper last moved it).
    max_hold_sec: float = 3600.0
    #: Retries it holds now.
    held: int = 0
    #: Its next probe time has come (the database's clock).
    probe_due: bool = False

    @property
    def failure_ratio(self) -> float | None:
        return self.failures / self.attempts if self.attempts else None

    @classmethod
    def from_row(cls, row: Record) -> Breaker:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: row[k] for k in row.keys() if k in names})


@dataclass(frozen=True, slots=True)
class WindowBucket:
    """One second of one handler's finished attempts."""

    tenant_id: str
    pool: str
    handler: str
    bucket: datetime
    attempts: int
    failures: int


@dataclass(frozen=True, slots=True)
class Transition:
    """A move a caller wants: compare-and-set from ``breaker.version``."""

    breaker: Breaker
    to_state: str
    action: str
    actor: str
    #: Seconds from now to the next probe (OPEN: the cool-down; HALF_OPEN: the probes' deadline).
    next_probe_in_sec: float | None = None
    cooldown_sec: float = 0.0
    probe_limit: int = 0
    manual: bool = False
    attempts: int = 0
    failures: int = 0
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: When the new state's counting starts (None: the transition's own time) ...
    since: datetime | None = None
    #: ... and what the window's bucket of that second held by then (not the new state's to judge).
    since_attempts: int = 0
    since_failures: int = 0
    #: The hold bound the breaker carries from now (None: unchanged).
    max_hold_sec: float | None = None


@dataclass(frozen=True, slots=True)
class Released:
    """A released retry (``execution_id``) or first fire (then the job's id), with its new time."""

    execution_id: UUID
    shard: int
    next_attempt_at: datetime


@dataclass(frozen=True, slots=True)
class GateResult:
    """What the breakers did to one retry transaction's claims."""

    #: Claims held (not dispatched): their retry moved to their breaker's next probe.
    held: frozenset[UUID] = frozenset()
    #: Claims let through as half-open probes.
    probes: frozenset[UUID] = frozenset()
    #: Of ``held``, the claims held past their bound whose attempt ended without running (DEAD if the last).
    ended: frozenset[UUID] = frozenset()


class BreakerStore(Protocol):
    async def now(self) -> datetime: ...

    async def quiet(self) -> bool: ...

    async def window_counts(self, since: datetime) -> list[WindowBucket]: ...

    async def prune_counts(self, before: datetime) -> int: ...

    async def tenant_settings(self) -> dict[str, Mapping[str, Any]]: ...

    async def all_breakers(self) -> list[Breaker]: ...

    async def tenant_breakers(self, tenant_id: str, pool: str | None, state: str | None) -> list[Breaker]: ...

    async def get_breaker(self, tenant_id: str, breaker_id: UUID) -> Breaker | None: ...

    async def ensure_breakers(self, handlers: Sequence[tuple[str, str, str]], since: datetime) -> None: ...

    async def record_window(self, windows: Sequence[tuple[UUID, int, int]]) -> None: ...

    async def transition(self, move: Transition) -> Breaker | None: ...

    async def release_held(self, breaker_id: UUID, spread_sec: float) -> list[Released]: ...

    async def release_first_fires(self, breaker: Breaker, spread_sec: float) -> list[Released]: ...


class PostgresBreakerStore:
    """:class:`BreakerStore` over the shared pool."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def now(self) -> datetime:
        return cast(datetime, await self._db.pool.fetchval(Q["now"]))

    async def quiet(self) -> bool:
        """Nothing ended within any window, every breaker is CLOSED with empty counts, nothing is held."""
        return bool(await self._db.pool.fetchval(Q["quiet"]))

    async def window_counts(self, since: datetime) -> list[WindowBucket]:
        rows = await self._db.pool.fetch(Q["window_counts"], since)
        return [
            WindowBucket(r["tenant_id"], r["pool"], r["handler"], r["bucket"], r["attempts"], r["failures"])
            for r in rows
        ]

    async def prune_counts(self, before: datetime) -> int:
        status = await self._db.pool.execute(Q["prune_counts"], before)
        return int(status.split()[-1])

    async def tenant_settings(self) -> dict[str, Mapping[str, Any]]:
        return {r["id"]: r["breaker"] for r in await self._db.pool.fetch(Q["tenant_settings"])}

    async def all_breakers(self) -> list[Breaker]:
        return [Breaker.from_row(r) for r in await self._db.pool.fetch(Q["all_breakers"])]

    async def tenant_breakers(self, tenant_id: str, pool: str | None, state: str | None) -> list[Breaker]:
        rows = await self._db.pool.fetch(Q["tenant_breakers"], tenant_id, pool, state)
        return [Breaker.from_row(r) for r in rows]

    async def get_breaker(self, tenant_id: str, breaker_id: UUID) -> Breaker | None:
        row = await self._db.pool.fetchrow(Q["get_breaker"], breaker_id, tenant_id)
        return Breaker.from_row(row) if row is not None else None

    async def ensure_breakers(self, handlers: Sequence[tuple[str, str, str]], since: datetime) -> None:
        if handlers:
            await self._db.pool.execute(
                Q["ensure_breakers"],
                [h[0] for h in handlers],
                [h[1] for h in handlers],
                [h[2] for h in handlers],
                since,
            )

    async def record_window(self, windows: Sequence[tuple[UUID, int, int]]) -> None:
        if windows:
            await self._db.pool.execute(
                Q["record_window"], [w[0] for w in windows], [w[1] for w in windows], [w[2] for w in windows]
            )

    async def transition(self, move: Transition) -> Breaker | None:
        """Compare-and-set ``move`` with its audit row and its incident; None when the breaker changed meanwhile."""
        b = move.breaker
        async with self._db.pool.acquire() as conn, conn.transaction():
            moved = await self._transition_on(conn, move)
            if moved is not None and (incident := breaker_incident(b, moved, move.action)) is not None:
                await record_incidents_on(conn, [incident])
        return moved

    async def _transition_on(self, conn: asyncpg.Connection, move: Transition) -> Breaker | None:
        b = move.breaker
        row = await conn.fetchrow(
            Q["transition"],
            b.id,
            b.version,
            move.to_state,
            move.next_probe_in_sec,
            move.cooldown_sec,
            move.probe_limit,
            move.manual,
            move.attempts,
            move.failures,
            move.action,
            move.actor,
            dict(move.detail),
            move.since,
            move.since_attempts,
            move.since_failures,
            move.max_hold_sec,
        )
        return Breaker.from_row(row) if row is not None else None

    async def release_held(self, breaker_id: UUID, spread_sec: float) -> list[Released]:
        rows = await self._db.pool.fetch(Q["release_held"], breaker_id, spread_sec)
        return [Released(r["id"], r["shard"], r["next_attempt_at"]) for r in rows if r["next_attempt_at"] is not None]

    async def release_first_fires(self, breaker: Breaker, spread_sec: float) -> list[Released]:
        """The held first fires of a closed breaker's handler, spread at random ({job id, shard, fire time})."""
        rows = await self._db.pool.fetch(
            Q["release_first_fires"], breaker.tenant_id, breaker.pool, breaker.handler, spread_sec
        )
        return [Released(r["id"], r["shard"], r["next_fire_at"]) for r in rows]


def breaker_incident(before: Breaker, after: Breaker, action: str = "") -> Incident | None:
    """The incident of a breaker's move from ``before`` to ``after``, if users would call it one: **opened**
    when it leaves CLOSED, **closed** when it comes back (its probes through HALF_OPEN and back to OPEN are one
    long outage, not new ones). Keyed by the breaker and the version the move gave it: recorded once, whoever
    judged the same window. ``action`` is the audited action (``opened_by_operator`` for an operator's hand)."""
    if before.state == CLOSED and after.state != CLOSED:
        event = BREAKER_OPENED
    elif before.state != CLOSED and after.state == CLOSED:
        event = BREAKER_CLOSED
    else:
        return None
    return Incident(
        tenant_id=after.tenant_id,
        event=event,
        incident_key=f"{event}:{after.id}:{after.version}",
        pool=after.pool,
        detail={
            "breakerId": str(after.id),
            "handler": after.handler,
            "state": after.state,
            "attempts": after.attempts,
            "failures": after.failures,
            "manual": after.manual,
            "byOperator": action.endswith("_by_operator"),
        },
    )


async def gate_retries(conn: asyncpg.Connection, execution_ids: Sequence[UUID]) -> GateResult:
    """Inside the dispatcher's fenced retry transaction: hold the claimed retries whose breaker is OPEN, let a
    HALF_OPEN breaker's remaining probes through (the breaker row locked: two shards share one budget), and end
    without running the attempts of those held past their bound (see the module docstring).

    The common case — every breaker CLOSED — costs one primary-key join that returns nothing.
    """
    if not execution_ids:
        return GateResult()
    rows = await conn.fetch(Q["gate"], list(execution_ids))
    if not rows:
        return GateResult()
    held: list[tuple[UUID, UUID, datetime]] = []
    ended: list[tuple[UUID, int, int]] = []
    probes: list[UUID] = []
    budget: dict[UUID, int] = {}
    for row in rows:
        breaker_id = row["breaker_id"]
        if row["state"] == HALF_OPEN:
            left = budget.setdefault(breaker_id, max(0, row["probe_limit"] - row["probes_sent"]))
            if left > 0:
                budget[breaker_id] = left - 1
                probes.append(row["id"])
                continue
        if row["hold_expired"]:
            policy = RetryPolicy.from_json(row["retry_policy"])
            ended.append((row["id"], row["attempt"], policy.delay_ms(row["attempt"] + 1)))
        else:
            held.append((row["id"], breaker_id, row["hold_until"]))
    if held:
        await conn.execute(Q["hold"], [h[0] for h in held], [h[1] for h in held], HOLD_JITTER_SEC, [h[2] for h in held])
    if ended:
        await conn.execute(
            Q["end_held"], [e[0] for e in ended], [e[1] for e in ended], [e[2] for e in ended], HOLD_ACTOR
        )
    if probes:
        sent: dict[UUID, int] = {}
        for row in rows:
            if row["id"] in probes:
                sent[row["breaker_id"]] = sent.get(row["breaker_id"], 0) + 1
        await conn.execute(Q["count_probes"], list(sent), list(sent.values()))
        await conn.execute(Q["unhold"], probes)
    not_dispatched = frozenset(h[0] for h in held) | frozenset(e[0] for e in ended)
    return GateResult(held=not_dispatched, probes=frozenset(probes), ended=frozenset(e[0] for e in ended))


def holds_first_fires(job: Record) -> bool:
    """The job chose ``breaker.firstFires = HOLD`` (and did not opt out of its breaker)."""
    choice = job.get("breaker")
    return choice is not None and choice.get("firstFires") == "HOLD" and choice.get("enabled", True) is not False


async def hold_first_fires(conn: asyncpg.Connection, due: Sequence[Record]) -> dict[UUID, datetime]:
    """Inside the dispatcher's fenced dispatch transaction, the due jobs locked: the jobs that chose to hold
    their first fires while their handler's breaker is open fire later instead ({job id: new fire time}).

    Only scheduled fires are held (a manual trigger runs as asked), and only jobs that chose HOLD cost a
    statement: by default this is free.
    """
    candidates = [
        row["id"]
        for row in due
        if holds_first_fires(row)
        and row["next_fire_at"] is not None
        and row["next_fire_at"] <= row["claimed_due"]
        and (row.get("trigger_at") is None or row["trigger_at"] > row["claimed_due"])
    ]
    if not candidates:
        return {}
    rows = await conn.fetch(Q["hold_first_fires"], candidates, HOLD_JITTER_SEC)
    return {row["id"]: row["next_fire_at"] for row in rows}
