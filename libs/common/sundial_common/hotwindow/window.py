"""The Redis hot window: one ZSET per shard of the occurrences due soon, scored by epoch milliseconds.

Redis is a cache of Postgres here (DESIGN invariant 1): anything in it can vanish and the hydrator
rebuilds it. Keys carry a ``{shard}`` hash tag so a shard's keys live on one Redis Cluster slot and
its Lua scripts stay atomic there.

Members are ``j:<job id>``: a job has one next occurrence at a time, and its score is when. A scheduled
retry is ``r:<execution id>``, scored at its next attempt: a retry is a delayed occurrence through the same
window, claimed by the same script and dispatched under the same fence.

Wake-ups. A shard leader sleeps until its window's earliest member is due (the claim returns it), and never
longer than :data:`WAKE_HORIZON_SEC`. A writer that adds a member due sooner than that announces it on
:data:`WAKE_CHANNEL` (``<shard> <epoch ms>``, in the same round trip as the write), so the leader wakes for it
at once; a lost announcement (Redis pub/sub is at most once) costs at most the horizon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol
from uuid import UUID

from redis.asyncio import Redis

from sundial_common.domain.ids import parse_id
from sundial_common.runtime.clock import from_ms, to_ms
from sundial_common.stores.types import Occurrence, RetryDue


class EndedAttempt(Protocol):
    """An attempt Postgres just ended (:class:`~sundial_common.stores.executions.Finished`): its shard, and the
    retry it scheduled if any."""

    @property
    def shard(self) -> int: ...
    @property
    def retry(self) -> RetryDue | None: ...


log = logging.getLogger(__name__)

# Claim = read the due members and remove them in one atomic step, so two claimers never both win.
# ARGV: now (ms), limit, ahead (ms), ahead_min, burst (ms), burst_min. When at least ahead_min members are due
# by ahead (or burst_min by burst, a shorter horizon), jobs' members due by then are taken too (a burst is claimed
# before it is due); a retry is only ever taken once it is due.
_CLAIM = """
local now = tonumber(ARGV[1])
local upto = ARGV[1]
local ahead_min = tonumber(ARGV[4])
local burst_min = tonumber(ARGV[6])
if ahead_min > 0 and redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[3]) >= ahead_min then upto = ARGV[3]
elseif burst_min > 0 and redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[5]) >= burst_min then upto = ARGV[5] end
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', upto, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local taken = {}
local members = {}
for i = 1, #items, 2 do
  if tonumber(items[i + 1]) <= now or string.sub(items[i], 1, 2) == 'j:' then
    taken[#taken + 1] = items[i]
    taken[#taken + 1] = items[i + 1]
    members[#members + 1] = items[i]
    if #members == 500 then redis.call('ZREM', KEYS[1], unpack(members)); members = {} end
  end
end
if #members > 0 then redis.call('ZREM', KEYS[1], unpack(members)) end
return {taken, redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')}
"""
#: Longest a shard leader sleeps without looking at its window; members due sooner are announced on WAKE_CHANNEL.
#: It is what a lost announcement may cost (the listener wakes every leader once it subscribes again after a loss),
#: and an idle leader's one claim per horizon: 5 s makes an idle ``make up``'s 8 shards claim 1.6 times a second
#: instead of 8. A leader with published marks waiting wakes for them (``ShardDispatcher.next_look``).
WAKE_HORIZON_SEC = 5.0
#: Pub/sub channel of wake-ups (not a key: Redis Cluster broadcasts it to every node).
WAKE_CHANNEL = "sundial:hot-window:added"

# Hydrate = add members and move the shard's watermark, but only if the watermark is still the one
# the hydrator read. If Redis was flushed in between, the watermark is gone and nothing is written:
# the hydrator starts over from the beginning, which is exactly the rebuild we want.
_HYDRATE = """
local current = redis.call('GET', KEYS[2])
if (current or '') ~= ARGV[1] then return -1 end
local n = 0
local args = {}
for i = 3, #ARGV, 2 do
  args[#args + 1] = ARGV[i]
  args[#args + 1] = ARGV[i + 1]
  if #args == 1000 then n = n + redis.call('ZADD', KEYS[1], unpack(args)); args = {} end
end
if #args > 0 then n = n + redis.call('ZADD', KEYS[1], unpack(args)) end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2]) end
return n
"""


def _now_ms() -> float:
    # Only decides whether an add is worth announcing (a wrong guess costs one message, or the horizon).
    return time.time() * 1000


def member(job_id: UUID) -> str:
    return f"j:{job_id}"


def retry_member(execution_id: UUID) -> str:
    return f"r:{execution_id}"


def _occurrence(raw_member: bytes | str, score: float) -> Occurrence:
    text = raw_member.decode() if isinstance(raw_member, bytes) else raw_member
    return Occurrence(UUID(text.removeprefix("j:")), from_ms(score))


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim took out of a shard's window: jobs' next fires and scheduled retries."""

    jobs: list[Occurrence] = field(default_factory=list)
    retries: list[RetryDue] = field(default_factory=list)
    #: When the earliest member left in the window after the claim is due (None: the window is empty).
    next_due: datetime | None = None

    def __len__(self) -> int:
        return len(self.jobs) + len(self.retries)


def parse_claimed(flat: Sequence[bytes | str], head: Sequence[bytes | str] = ()) -> Claimed:
    claimed = Claimed(next_due=from_ms(float(head[1])) if len(head) == 2 else None)
    times: dict[bytes | str, datetime] = {}  # a burst shares a few scores: convert each once
    for i in range(0, len(flat), 2):
        raw, score = flat[i], flat[i + 1]
        due = times.get(score)
        if due is None:
            due = times[score] = from_ms(float(score))
        text = raw.decode() if isinstance(raw, bytes) else raw
        kind, _, ident = text.partition(":")
        # Parsed in C (parse_id): a dispatcher hashes each claimed id, formats it back into its member and sends it
        # to Postgres, which uuid.UUID does in Python (~2 % of a dispatcher's samples under a steady stream, with
        # its parse).
        if kind == "r":
            claimed.retries.append(RetryDue(parse_id(ident), due))
        elif kind == "j":
            claimed.jobs.append(Occurrence(parse_id(ident), due))
        else:  # not ours: dropping it is all a claim can do with it
            log.warning("hot window: ignoring unknown member %r", text)
    return claimed


class HotWindow:
    """Per-shard due-soon index over one Redis connection pool."""

    def __init__(self, redis: Redis, prefix: str = "sundial") -> None:
        self.redis = redis
        self.prefix = prefix
        self._claim = redis.register_script(_CLAIM)
        self._hydrate = redis.register_script(_HYDRATE)

    def key(self, shard: int) -> str:
        return f"{self.prefix}:{{{shard}}}:hot"

    def watermark_key(self, shard: int) -> str:
        return f"{self.prefix}:{{{shard}}}:hydrated-until"

    def held_key(self, shard: int) -> str:
        """Jobs (and scheduled retries) a shard leader's fair buffer holds (claimed, not dispatched yet): not lost, so
        not overdue."""
        return f"{self.prefix}:{{{shard}}}:held"

    async def hold(self, shard: int, job_ids: Sequence[UUID], ttl_sec: float, released: Sequence[UUID] = ()) -> None:
        """Record ``job_ids`` as held and keep the whole set for ``ttl_sec`` more (the leader renews it while it
        holds any; if it dies the set expires and the hydrator's overdue scan recovers what it held). ``released``
        (dispatched meanwhile) leave the set in the same round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            if released:
                pipe.srem(self.held_key(shard), *(member(j) for j in released))
            for start in range(0, len(job_ids), 5000):
                pipe.sadd(self.held_key(shard), *(member(j) for j in job_ids[start : start + 5000]))
            pipe.pexpire(self.held_key(shard), int(ttl_sec * 1000))
            await pipe.execute()

    async def unhold(self, shard: int, job_ids: Sequence[UUID]) -> None:
        if job_ids:
            await self.redis.srem(self.held_key(shard), *(member(j) for j in job_ids))

    async def drop_held(self, shard: int) -> None:
        await self.redis.delete(self.held_key(shard))

    async def not_held(self, shard: int, occurrences: Sequence[Occurrence]) -> list[Occurrence]:
        """The occurrences whose job no live leader's buffer holds."""
        if not occurrences:
            return []
        flags = await self.redis.smismember(self.held_key(shard), [member(o.job_id) for o in occurrences])
        return [o for o, held in zip(occurrences, flags, strict=True) if not held]

    async def retries_not_held(self, shard: int, retries: Sequence[RetryDue]) -> list[RetryDue]:
        """The scheduled retries no live leader's buffer holds. A held retry is named in the held set by its
        execution's id as a job is by its own (ids are never shared between the two)."""
        if not retries:
            return []
        flags = await self.redis.smismember(self.held_key(shard), [member(r.execution_id) for r in retries])
        return [r for r, held in zip(retries, flags, strict=True) if not held]

    async def add(self, shard: int, occurrences: Sequence[Occurrence], *, only_new: bool = False) -> None:
        """Add (or move) members. ``only_new`` leaves members that already exist where they are (ZADD NX)."""
        if occurrences:
            await self._add(shard, {member(o.job_id): to_ms(o.due) for o in occurrences}, only_new)

    async def _add(self, shard: int, scores: dict[str, int], only_new: bool) -> None:
        """ZADD, and announce the earliest member if a sleeping leader could miss it (one round trip)."""
        earliest = min(scores.values())
        if earliest >= _now_ms() + WAKE_HORIZON_SEC * 1000:
            await self.redis.zadd(self.key(shard), scores, nx=only_new)
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self.key(shard), scores, nx=only_new)
            pipe.publish(WAKE_CHANNEL, f"{shard} {earliest}")
            await pipe.execute()

    async def announce(self, shard: int, due: datetime) -> None:
        """Wake the shard's leader for a member due at ``due`` written otherwise (a script); only if it is soon."""
        if to_ms(due) < _now_ms() + WAKE_HORIZON_SEC * 1000:
            await self.redis.publish(WAKE_CHANNEL, f"{shard} {to_ms(due)}")

    async def remove(self, shard: int, job_ids: Sequence[UUID]) -> None:
        if job_ids:
            await self.redis.zrem(self.key(shard), *(member(j) for j in job_ids))

    async def claim(self, shard: int, now: datetime, limit: int) -> list[Occurrence]:
        """Atomically take up to ``limit`` members due at or before ``now``; only the jobs' are returned.

        Retry members it takes are left to the hydrator's overdue scan: callers that dispatch retries use
        :meth:`claim_due`.
        """
        return (await self.claim_due(shard, now, limit)).jobs

    async def claim_due(
        self,
        shard: int,
        now: datetime,
        limit: int,
        *,
        ahead: datetime | None = None,
        ahead_min: int = 0,
        burst: datetime | None = None,
        burst_min: int = 0,
    ) -> Claimed:
        """Atomically take up to ``limit`` members of any kind due at or before ``now``.

        With ``ahead`` and ``ahead_min``: if at least ``ahead_min`` members are due by ``ahead`` (a burst is
        coming), jobs' members due by ``ahead`` are taken too, so their claim is paid before they are due; the
        caller holds them until then. Otherwise, with ``burst`` and ``burst_min``, the same for a shorter horizon
        and a smaller count. Retries are taken only once due.
        """
        upto = to_ms(ahead if ahead is not None else now)
        burst_upto = to_ms(burst if burst is not None else now)
        flat, head = await self._claim(
            keys=[self.key(shard)],
            args=[to_ms(now), limit, upto, ahead_min if ahead else 0, burst_upto, burst_min if burst else 0],
        )
        return parse_claimed(flat, head)

    async def add_retries(self, shard: int, retries: Sequence[RetryDue], *, only_new: bool = False) -> None:
        """Add (or move) scheduled retries' members. ``only_new``: leave existing ones where they are."""
        if retries:
            await self._add(shard, {retry_member(r.execution_id): to_ms(r.due) for r in retries}, only_new)

    async def add_retries_due(self, ended: Iterable[EndedAttempt], horizon: datetime) -> None:
        """Add the retries that attempts just ended scheduled, those due before ``horizon``, each to its shard's
        window; the later ones are the hydrator's to promote. One round trip per shard."""
        by_shard: dict[int, list[RetryDue]] = {}
        for attempt in ended:
            retry = attempt.retry
            if retry is not None and retry.due < horizon:
                by_shard.setdefault(attempt.shard, []).append(retry)
        for shard, retries in by_shard.items():
            await self.add_retries(shard, retries)

    async def watermarks(self, shards: int) -> list[int | None]:
        """Epoch ms up to which the hydrator has promoted each shard 0..``shards``-1 (None after a flush), in
        one round trip."""
        raws = await self.redis.mget([self.watermark_key(shard) for shard in range(shards)])
        return [int(raw) if raw is not None else None for raw in raws]

    async def hydrate(
        self,
        shard: int,
        expected: int | None,
        new_watermark: int | None,
        occurrences: Sequence[Occurrence],
        retries: Sequence[RetryDue] = (),
    ) -> bool:
        """Add ``occurrences`` (and scheduled ``retries``) and move the watermark (unless None) in one step.

        False, and nothing written, if the watermark is no longer ``expected`` (Redis was flushed).
        """
        args: list[str | int] = [
            "" if expected is None else str(expected),
            "" if new_watermark is None else str(new_watermark),
        ]
        for o in occurrences:
            args += [to_ms(o.due), member(o.job_id)]
        for r in retries:
            args += [to_ms(r.due), retry_member(r.execution_id)]
        result = await self._hydrate(keys=[self.key(shard), self.watermark_key(shard)], args=args)
        dues = [o.due for o in occurrences] + [r.due for r in retries]
        if int(result) > 0 and dues:  # a rebuild after a flush promotes members due now
            await self.announce(shard, min(dues))
        return int(result) >= 0

    async def size(self, shard: int) -> int:
        return int(await self.redis.zcard(self.key(shard)))

    async def census(self, shards: int) -> list[tuple[int, datetime | None]]:
        """Per shard 0..``shards``-1: (members, due time of the earliest member or None), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in range(shards):
                pipe.zcard(self.key(shard))
                pipe.zrange(self.key(shard), 0, 0, withscores=True)
            replies = await pipe.execute()
        census: list[tuple[int, datetime | None]] = []
        for members, first in zip(replies[::2], replies[1::2], strict=True):
            census.append((int(members), from_ms(first[0][1]) if first else None))
        return census
