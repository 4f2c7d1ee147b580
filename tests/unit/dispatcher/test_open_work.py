"""The pool room a fair pass has: the queue cap (fixed, or following the start rate), what the process took since
its read, and stalled pools."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement
from sundial_common.stores.tenants import OpenExecutions
from sundial_common.stores.types import Occurrence
from sundial_common.testing import FakeClock, InMemoryTenantStore
from sundial_dispatcher.fairness import FairnessConfig, FairQueue, OpenWork, Waiting
from sundial_dispatcher.fairness.registry import RegisteredPools

DUE = datetime(2026, 1, 1, tzinfo=UTC)


class Counts(InMemoryTenantStore):
    """The in-memory tenant registry with a scripted census of open executions (which it does not hold)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[OpenExecutions] = []
        self.reads = 0

    async def open_executions(
        self, queued_within_sec: float, fresh_within_sec: float | None = None
    ) -> list[OpenExecutions]:
        self.reads += 1
        return self.rows


def open_work(counts: Counts, clock: FakeClock, pool_queue_min: int = 1000) -> OpenWork:
    config = FairnessConfig(
        pool_queue_cap=1000, pool_queue_min=pool_queue_min, stalled_pool_sec=3.0, counts_refresh_sec=0.25
    )
    return OpenWork(counts, config, clock.monotonic)


async def test_a_pool_with_work_waiting_and_none_running_is_not_held_back_once_stalled() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock)
    counts.rows = [OpenExecutions("a", "idle", queued=1000, pending=1000, running=0, open=1000)]
    await work.refresh()
    assert work.pool_room(shards=4, batch_size=500)[0]["idle"] == 0  # full, and not stalled yet
    clock.advance(3.0)
    await work.refresh()
    assert work.pool_room(shards=4, batch_size=500)[0]["idle"] == 500  # nothing ran for 3 s: no cap
    counts.rows = [OpenExecutions("a", "idle", queued=1000, pending=1000, running=1, open=1001)]
    clock.advance(1.0)
    await work.refresh()
    assert work.pool_room(shards=4, batch_size=500)[0]["idle"] == 0  # a worker runs there again: the cap holds


async def test_a_busy_pool_is_never_stalled_and_what_a_pass_took_counts_until_the_next_read() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock)
    counts.rows = [OpenExecutions("a", "busy", queued=600, pending=600, running=64, open=664)]
    for _ in range(5):
        clock.advance(2.0)
        await work.refresh()
    room, default = work.pool_room(shards=4, batch_size=500)
    assert room["busy"] == 100 and default == 250  # a quarter of the room left, of the cap for other pools
    work.took_unattributed(200)
    await work.refresh()  # within counts_refresh_sec: not read again
    assert counts.reads == 5
    room, default = work.pool_room(shards=4, batch_size=500)
    assert room["busy"] == 50 and default == 200


async def test_a_new_leader_dates_a_stall_from_the_oldest_waiting_execution() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock)
    counts.rows = [OpenExecutions("a", "idle", queued=1000, pending=1000, running=0, open=1000, waited_sec=4.0)]
    await work.refresh()
    assert work.stalled("idle")  # waiting for 4 s with none running, before this process looked


def pending(pool: str, n: int, running: int = 32) -> OpenExecutions:
    return OpenExecutions("a", pool, queued=n, pending=n, running=running, open=n + running)


async def test_a_backlogged_pools_cap_follows_its_start_rate_and_grows_while_its_workers_keep_up() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=16)
    counts.rows = [pending("p", 0, running=0)]
    await work.refresh()
    # Nothing seen starting in the pool yet (maybe no worker at all): the small first cap, so a first burst does
    # not go to the topic whole ahead of the HIGH work that comes due during it.
    assert work.pool_room(shards=1, batch_size=500)[0]["p"] == 16 and work.pool_room(1, 500)[1] == 16
    counts.rows = [pending("p", 0, running=1)]
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 16  # its workers run: from now on its cap follows them, from the smallest
    # The workers start everything the cap lets through, and a pass held more back: the cap doubles per read.
    for expected in (32, 64, 128):
        counts.rows = [pending("p", 0)]
        work.took([Waiting(Occurrence(uuid.uuid4(), DUE), "a", "p") for _ in range(work.cap("p"))])
        work.limited(["p"])
        clock.advance(0.25)
        await work.refresh()
        assert work.cap("p") == expected
    # Backlogged: 128 queued, the workers started 40 in 0.25 s (160/s) -> half a second of starts.
    counts.rows = [pending("p", 128)]
    clock.advance(0.25)
    await work.refresh()
    counts.rows = [pending("p", 88)]
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 80
    assert work.pool_room(shards=1, batch_size=500)[0]["p"] == 0  # 88 queued: nothing more until it drains
    assert work.high_room()["p"] == 72, "a tenant's HIGH work may fill it to twice the cap"
    # Slow 1 s handlers on 8 slots (8 starts/s): the cap drops to its floor; nobody publishing keeps it there.
    counts.rows = [pending("p", 86)]
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 16
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 16


async def test_work_stuck_with_a_stopped_worker_does_not_hold_the_live_workers_back() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=4)
    counts.rows = [OpenExecutions("a", "p", queued=40, pending=40, running=8, open=48, fresh=40)]
    await work.refresh()
    clock.advance(0.25)
    counts.rows = [OpenExecutions("a", "p", queued=36, pending=36, running=8, open=44, fresh=36)]
    await work.refresh()
    assert work.pool_room(shards=1, batch_size=500)[0]["p"] == 0, "a backlog: the cap follows the starts (8)"
    # The same 36 wait, none dispatched within the last second: they sit with a worker that was killed.
    clock.advance(0.25)
    counts.rows = [OpenExecutions("a", "p", queued=36, pending=36, running=8, open=44, fresh=0)]
    await work.refresh()
    assert work.pool_room(shards=1, batch_size=500)[0]["p"] == 4, "the live workers get work again"


async def test_a_pool_first_seen_starting_work_gets_the_cap_of_its_start_rate_not_the_floor() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=4)
    counts.rows = [pending("p", 0, running=0)]
    await work.refresh()
    # Uncontended passes publish 80 in 0.25 s without looking up whose they are (one pool has work: it is its).
    work.took_unattributed(80)
    counts.rows = [pending("p", 5, running=3)]
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 150  # 75 started in 0.25 s (300/s): half a second of them, at once
    room = work.pool_room(shards=1, batch_size=500)[0]["p"]
    assert room == 145, "the stream goes on without waiting for the cap to grow"


async def test_takes_not_attributed_count_for_no_pool_while_several_have_work() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=4)
    counts.rows = [pending("p", 0, running=0), pending("q", 0, running=0)]
    await work.refresh()
    work.took_unattributed(80)  # whose is not known: the caps err short
    counts.rows = [pending("p", 5, running=3), pending("q", 5, running=3)]
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 4 and work.cap("q") == 4


async def test_a_pool_whose_workers_empty_its_queue_gets_the_cap_of_their_rate_not_just_twice_its_own() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=4)
    counts.rows = [pending("p", 0)]
    await work.refresh()
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 4
    # 500 waited (published before the cap was measured), and all started within 0.25 s while work was held back.
    counts.rows = [pending("p", 500)]
    clock.advance(0.25)
    await work.refresh()
    work.limited(["p"])
    counts.rows = [pending("p", 0)]
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 1000  # 2,000/s: a second of them (its ceiling), not 8


async def test_the_drain_counts_what_the_other_dispatchers_published_for_their_shards() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=4)
    work.queues = {0: FairQueue(), 1: FairQueue()}  # this process leads 2 of the 4 shards
    counts.rows = [pending("p", 200)]
    await work.refresh()
    work.pool_room(shards=4, batch_size=500)
    # This process published 100 in 0.25 s; the other, leading the other two shards, as many: the queue held.
    work.took([Waiting(Occurrence(uuid.uuid4(), DUE), "a", "p") for _ in range(100)])
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("p") == 400  # 200 started in 0.25 s (800/s), not the 100 this process's count alone says


async def test_a_pool_with_no_worker_is_not_taken_for_one_draining_when_the_other_dispatcher_publishes_less() -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=4)
    work.queues = {0: FairQueue(), 1: FairQueue()}  # this process leads 2 of the 4 shards
    counts.rows = [pending("p", 200, running=0)]
    await work.refresh()
    work.pool_room(shards=4, batch_size=500)
    # This process published 100; the other one, handing its shards over, only 20: nothing started at all.
    work.took([Waiting(Occurrence(uuid.uuid4(), DUE), "a", "p") for _ in range(100)])
    counts.rows = [pending("p", 320, running=0)]
    clock.advance(0.25)
    await work.refresh()
    assert "p" not in work.started_work
    # Still the first cap (full): the rest waits in the buffer, ordered, until a start or the stalled-pool rule.
    assert work.cap("p") == 8 and work.pool_room(shards=4, batch_size=500)[0]["p"] == 0


async def test_work_published_ahead_and_held_by_a_worker_is_not_taken_for_a_start() -> None:
    # A sparse shard publishes ahead of the due instant (the worker holds the message until then): at the next
    # read the execution is neither started nor due. Counted as drained, a pool with no worker at all would look
    # like one starting work, get a short cap, and stop dispatching until the stalled-pool rule lifted it.
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock, pool_queue_min=16)
    counts.rows = [OpenExecutions("a", "p", queued=0, pending=0, running=0, open=0)]
    await work.refresh()
    work.took([Waiting(Occurrence(uuid.uuid4(), DUE), "a", "p") for _ in range(3)])
    counts.rows = [OpenExecutions("a", "p", queued=0, pending=0, running=0, open=3, ahead=3)]
    clock.advance(0.25)
    await work.refresh()
    assert "p" not in work.started_work and work.cap("p") == 16  # nothing started: the first cap still
    counts.rows = [OpenExecutions("a", "p", queued=2, pending=2, running=0, open=3, ahead=1)]
    clock.advance(0.25)
    await work.refresh()
    assert "p" not in work.started_work  # two came due, none started


async def test_a_pool_that_stalls_between_two_reads_is_said_to_be_stalled_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counts, clock = Counts(), FakeClock()
    work = open_work(counts, clock)
    counts.rows = [OpenExecutions("a", "idle", queued=10, pending=10, running=0, open=10)]
    await work.refresh()
    clock.advance(2.0)
    await work.refresh()  # waiting 2 s: not stalled yet
    clock.advance(2.0)
    with caplog.at_level(logging.INFO, logger="sundial_dispatcher.fairness.pool_room"):
        await work.refresh()  # 4 s: stalled since this read
        await work.refresh()  # within counts_refresh_sec: not read again
        clock.advance(1.0)
        await work.refresh()
    said = [r.getMessage() for r in caplog.records if "pool idle" in r.getMessage()]
    assert len(said) == 1 and "none running" in said[0], said


class Announced:
    """Live workers as announced: free slots per pool (a scripted reading of the announcements)."""

    def __init__(self, slots: dict[str, list[int]]) -> None:
        self.slots = slots
        self.reads = 0
        self.down = False

    async def live_pools(self, pools: Sequence[str] | None = None) -> dict[str, list[WorkerAnnouncement]]:
        self.reads += 1
        if self.down:
            raise RedisConnectionError("Redis away")
        started = datetime(2026, 1, 1, tzinfo=UTC)
        return {
            pool: [WorkerAnnouncement(f"w{i}", pool, ("h",), n, n, "1", "host", 1, started) for i, n in enumerate(free)]
            for pool, free in self.slots.items()
        }


async def test_a_pools_first_burst_is_capped_at_the_free_slots_its_live_workers_announce() -> None:
    counts, clock = Counts(), FakeClock()
    live = Announced({"big": [256, 256], "small": [4]})
    config = FairnessConfig(pool_queue_cap=1000, pool_queue_min=4, pool_queue_first=8, slots_refresh_sec=1.0)
    work = OpenWork(counts, config, clock.monotonic, live=live)
    await work.refresh()
    room, unknown = work.pool_room(shards=1, batch_size=5000)
    # Two idle workers of 256 slots take 512 at once, one of 4 slots takes 4; a pool nobody announced the small cap.
    assert (room["big"], room["small"], unknown) == (512, 4, 8)
    assert work.pool_room(shards=4, batch_size=5000)[0]["big"] == 128  # each shard's share
    # What was published counts against it until the pool is seen starting work.
    work.took_executions([("a", "small")] * 3)
    assert work.pool_room(shards=1, batch_size=5000)[0]["small"] == 1
    # The reading is reused for slots_refresh_sec, then read again; Redis away keeps the last reading.
    clock.advance(0.5)
    await work.refresh()
    assert live.reads == 1
    live.down = True
    clock.advance(0.6)
    await work.refresh()
    assert live.reads == 2 and work.cap("big") == 512
    # Once its workers are seen starting work, the pool's cap follows them: at first what they can still start
    # (no drain measured yet, as for a dispatcher that takes over a busy pool), then their drain.
    live.down = False
    live.slots["big"] = [100, 28]
    counts.rows = [pending("big", 0, running=384)]
    clock.advance(1.0)
    await work.refresh()
    assert "big" in work.started_work and work.cap("big") == 128
    counts.rows = [pending("big", 100, running=512)]
    clock.advance(0.25)
    await work.refresh()
    counts.rows = [pending("big", 80, running=512)]
    clock.advance(0.25)
    await work.refresh()
    assert work.cap("big") == 40  # backlogged, 20 started in 0.25 s: half a second of starts


async def test_a_pool_held_at_its_first_cap_is_counted_again_soon_and_then_follows_its_start_rate() -> None:
    counts, clock = Counts(), FakeClock()
    live = Announced({"big": [256, 256], "slow": [4]})
    config = FairnessConfig(pool_queue_cap=1000, pool_queue_min=4, counts_refresh_sec=0.25, first_refresh_sec=0.05)
    work = OpenWork(counts, config, clock.monotonic, live=live)
    await work.refresh()
    assert counts.reads == 1
    # Nothing held back: the counts serve counts_refresh_sec.
    clock.advance(0.02)
    await work.refresh()
    assert counts.reads == 1
    # A pass filled both pools' first caps (the workers' free slots) and held the rest of their bursts back.
    work.took_executions([("a", "big")] * 512 + [("a", "slow")] * 4)
    work.limited(["big", "slow"])
    clock.advance(0.02)
    await work.refresh()
    assert counts.reads == 1  # read 0.04 s ago: the workers are still starting what went out
    # The workers started all of it: read again after first_refresh_sec, not a quarter of a second.
    counts.rows = [pending("big", 0, running=512), pending("slow", 0, running=4)]
    clock.advance(0.015)
    await work.refresh()
    assert counts.reads == 2 and {"big", "slow"} <= work.started_work
    # The caps follow what was started, counted over counts_refresh_sec: the free slots filling at once are not
    # a start rate (4 slots of 1 s handlers would otherwise queue 40, ten seconds of their starts).
    assert work.cap("big") == 1000 and work.cap("slow") == 8
    # Measured: the counts serve counts_refresh_sec again, whatever passes hold back.
    work.limited(["big"])
    clock.advance(0.1)
    await work.refresh()
    assert counts.reads == 2


async def test_a_pool_whose_workers_outpace_its_cap_is_counted_again_soon_until_the_cap_stops_growing() -> None:
    counts, clock = Counts(), FakeClock()
    live = Announced({"big": [128, 128]})
    config = FairnessConfig(pool_queue_cap=1000, pool_queue_min=4, counts_refresh_sec=0.25, first_refresh_sec=0.05)
    work = OpenWork(counts, config, clock.monotonic, live=live)
    await work.refresh()
    work.took_executions([("a", "big")] * 256)
    work.limited(["big"])
    counts.rows = [pending("big", 100, running=156)]
    clock.advance(0.06)
    await work.refresh()
    assert counts.reads == 2 and work.cap("big") == 312  # seen starting: 156 over a quarter of a second
    # A pass held the rest back while the workers started more than half of the queue: read again soon, not
    # after a quarter of a second with the queue run dry, and the cap doubles.
    work.took_executions([("a", "big")] * 212)
    work.limited(["big"])
    counts.rows = [pending("big", 60, running=256)]
    clock.advance(0.06)
    await work.refresh()
    assert counts.reads == 3 and work.cap("big") == 624
    # A read that soon which sees the queue half full: too short a drain to lower the cap by.
    work.took_executions([("a", "big")] * 564)
    work.limited(["big"])
    counts.rows = [pending("big", 400, running=256)]
    clock.advance(0.06)
    await work.refresh()
    assert counts.reads == 4 and work.cap("big") == 624
    # Half full: the workers no longer outpace it, and the counts serve counts_refresh_sec again.
    work.limited(["big"])
    clock.advance(0.1)
    await work.refresh()
    assert counts.reads == 4
    # Outpaced at the ceiling: nothing left to grow, the usual pace.
    counts.rows = [pending("big", 0, running=256)]
    clock.advance(0.16)
    await work.refresh()
    assert counts.reads == 5 and work.cap("big") == 1000
    work.limited(["big"])
    clock.advance(0.1)
    await work.refresh()
    assert counts.reads == 5


async def test_a_pool_with_no_live_worker_held_at_its_first_cap_is_counted_at_the_usual_pace() -> None:
    counts, clock = Counts(), FakeClock()
    config = FairnessConfig(counts_refresh_sec=0.25, first_refresh_sec=0.05)
    work = OpenWork(counts, config, clock.monotonic, live=Announced({}))
    await work.refresh()
    work.took_executions([("a", "nobody")] * 8)
    work.limited(["nobody"])
    clock.advance(0.1)
    await work.refresh()
    assert counts.reads == 1  # no worker to start it: an early read would tell nothing new


async def test_a_large_pass_skips_the_owners_lookup_only_while_each_registered_pool_has_a_room_of_its_own() -> None:
    # A fair pass may send more than a burst head without looking up whose its members are only if none can be in a
    # pool not seen at all (whose room is a share of the small first cap): every registered pool has its own room.
    counts, clock = Counts(), FakeClock()
    work = OpenWork(counts, FairnessConfig(), clock.monotonic, live=Announced({"big": [256]}))
    registry = RegisteredPools(counts, refresh_sec=1.0)

    async def every_pool_seen(after: float) -> bool:
        clock.advance(after)
        await work.refresh()
        await registry.read(clock.monotonic())
        return registry.all_seen(work.pool_room(shards=8, batch_size=1000)[0])

    assert not await every_pool_seen(0.0), "an empty registry vouches for nothing (jobs written around the API)"
    counts.pools = {"big", "batch"}
    assert not await every_pool_seen(1.0), "batch: registered, no live worker, nothing open"
    counts.rows = [pending("batch", 3, running=0)]
    assert await every_pool_seen(1.0), "batch has work open: its own room (a share of its first cap) bounds the pass"
    counts.pools.add("new")
    assert await every_pool_seen(0.5), "the registry is read at most every refresh_sec"
    assert not await every_pool_seen(0.5), "a pool registered since, not seen yet"
