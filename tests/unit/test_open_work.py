"""The pool room a fair pass has: the queue cap, what the process took since its read, and stalled pools."""

from __future__ import annotations

from sundial_common.stores.tenants import OpenExecutions
from sundial_dispatcher.fairness import FairnessConfig, OpenWork


class Counts:
    def __init__(self) -> None:
        self.rows: list[OpenExecutions] = []
        self.reads = 0

    async def open_executions(self, queued_within_sec: float) -> list[OpenExecutions]:
        self.reads += 1
        return self.rows


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def open_work(counts: Counts, clock: Clock) -> OpenWork:
    config = FairnessConfig(pool_queue_cap=1000, stalled_pool_sec=3.0, counts_refresh_sec=0.25)
    return OpenWork(counts, config, clock)  # type: ignore[arg-type]


async def test_a_pool_with_work_waiting_and_none_running_is_not_held_back_once_stalled() -> None:
    counts, clock = Counts(), Clock()
    work = open_work(counts, clock)
    counts.rows = [OpenExecutions("a", "idle", queued=1000, pending=1000, running=0, open=1000)]
    await work.refresh()
    assert work.pool_room(shards=4, batch_size=500)[0]["idle"] == 0  # full, and not stalled yet
    clock.now += 3.0
    await work.refresh()
    assert work.pool_room(shards=4, batch_size=500)[0]["idle"] == 500  # nothing ran for 3 s: no cap
    counts.rows = [OpenExecutions("a", "idle", queued=1000, pending=1000, running=1, open=1001)]
    clock.now += 1.0
    await work.refresh()
    assert work.pool_room(shards=4, batch_size=500)[0]["idle"] == 0  # a worker runs there again: the cap holds


async def test_a_busy_pool_is_never_stalled_and_what_a_pass_took_counts_until_the_next_read() -> None:
    counts, clock = Counts(), Clock()
    work = open_work(counts, clock)
    counts.rows = [OpenExecutions("a", "busy", queued=600, pending=600, running=64, open=664)]
    for _ in range(5):
        clock.now += 2.0
        await work.refresh()
    room, default = work.pool_room(shards=4, batch_size=500)
    assert room["busy"] == 100 and default == 250  # a quarter of the room left, of the cap for other pools
    work.took_unattributed(200)
    await work.refresh()  # within counts_refresh_sec: not read again
    assert counts.reads == 5
    room, default = work.pool_room(shards=4, batch_size=500)
    assert room["busy"] == 50 and default == 200


async def test_a_new_leader_dates_a_stall_from_the_oldest_waiting_execution() -> None:
    counts, clock = Counts(), Clock()
    work = open_work(counts, clock)
    counts.rows = [OpenExecutions("a", "idle", queued=1000, pending=1000, running=0, open=1000, waited_sec=4.0)]
    await work.refresh()
    assert work.stalled("idle")  # waiting for 4 s with none running, before this process looked
