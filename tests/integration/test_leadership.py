"""Shard leadership against a real etcd: hand-over on resign, on a crashed leader, on a lost trust window.

Every test uses its own key prefix, so tests never contend with each other's leftovers. ttl is 2 s (etcd's
minimum) with a 0.5 s margin: trust window 1.5 s, renewal every 0.67 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aetcd
import pytest
from sundial_common.coordination.leadership import (
    LeadershipConfig,
    LeadershipStopped,
    ShardLeadership,
    Term,
    run_as_leader,
)
from sundial_common.runtime.clock import Clock
from sundial_common.testing import FakeClock

T = TypeVar("T")
TTL = 2.0
MARGIN = 0.5
SHARD = 7


async def within(seconds: float, aw: Awaitable[T]) -> T:
    return await asyncio.wait_for(aw, seconds)


async def still_pending(task: asyncio.Task[Any], seconds: float = 0.3) -> bool:
    """A bounded negative check: True if ``task`` has not finished after ``seconds``."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return not done


@pytest.fixture
def config() -> LeadershipConfig:
    return LeadershipConfig(
        ttl_sec=TTL, margin_sec=MARGIN, key_prefix=f"/sundial/test-leadership/{uuid.uuid4().hex}/shards/"
    )


@pytest.fixture
async def observer(etcd_endpoint: str) -> AsyncIterator[aetcd.Client]:
    """A client of the test's own, to look at etcd the way an operator would."""
    host, port = etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        yield client


MakeLeadership = Callable[..., ShardLeadership]


@pytest.fixture
async def make_leadership(etcd_endpoint: str, config: LeadershipConfig) -> AsyncIterator[MakeLeadership]:
    """Build holders, each on its own etcd client (as separate replicas would be); stop and close all."""
    host, port = etcd_endpoint.rsplit(":", 1)
    made: list[tuple[ShardLeadership, aetcd.Client]] = []

    def make(holder: str, *, clock: Clock | None = None, client: aetcd.Client | None = None) -> ShardLeadership:
        client = client or aetcd.Client(host=host, port=int(port))
        leadership = ShardLeadership(client, SHARD, holder, config, clock)
        made.append((leadership, client))
        return leadership

    yield make
    for leadership, client in made:
        await leadership.stop()
        await client.close()


async def leader_of(observer: aetcd.Client, config: LeadershipConfig) -> tuple[str, int] | None:
    current = await observer.get(config.leader_key(SHARD).encode())
    return None if current is None else (current.value.decode(), current.create_revision)


async def test_one_holder_leads_and_a_second_blocks_until_it_resigns(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    alpha, beta = make_leadership("alpha"), make_leadership("beta")

    term = await within(5, alpha.acquire())
    assert term == Term(shard=SHARD, holder="alpha", revision=term.revision, lease_id=term.lease_id)
    assert alpha.trusted() and alpha.term == term and not alpha.lost.is_set()
    assert await leader_of(observer, config) == ("alpha", term.revision)
    assert await alpha.acquire() == term, "acquire() while leading returns the current term"

    beta_acquire = asyncio.create_task(beta.acquire())
    assert await still_pending(beta_acquire), "a second holder must not lead while the first does"
    assert beta.term is None and not beta.trusted()

    resigned_at = time.monotonic()
    await alpha.resign()
    beta_term = await within(5, beta_acquire)
    assert time.monotonic() - resigned_at < 0.5, "the standby takes over as soon as the key is deleted"
    assert beta_term.revision > term.revision, "fencing tokens only grow"
    assert alpha.lost.is_set() and alpha.lost_reason == "resigned"
    assert not alpha.trusted() and alpha.term is None
    assert await leader_of(observer, config) == ("beta", beta_term.revision)


async def test_standby_takes_over_after_the_leader_process_is_killed(
    etcd_endpoint: str, make_leadership: MakeLeadership, config: LeadershipConfig
) -> None:
    doomed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _LEADER_PROCESS,
        etcd_endpoint,
        config.key_prefix,
        str(SHARD),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert doomed.stdout is not None
        dead_token = int(await within(30, doomed.stdout.readline()))
        survivor = make_leadership("survivor")
        survivor_acquire = asyncio.create_task(survivor.acquire())
        assert await still_pending(survivor_acquire)

        killed_at = time.monotonic()
        os.kill(doomed.pid, signal.SIGKILL)  # no resign, no revoke: etcd must expire the lease
        term = await within(TTL + 1, survivor_acquire)
        assert time.monotonic() - killed_at < TTL + 1
        assert term.revision > dead_token
    finally:
        if doomed.returncode is None:
            doomed.kill()
        await doomed.wait()


_LEADER_PROCESS = """
import asyncio, sys
import aetcd
from sundial_common.coordination.leadership import LeadershipConfig, ShardLeadership

async def main() -> None:
    endpoint, prefix, shard = sys.argv[1], sys.argv[2], int(sys.argv[3])
    host, port = endpoint.rsplit(":", 1)
    config = LeadershipConfig(ttl_sec=2.0, margin_sec=0.5, key_prefix=prefix)
    leadership = ShardLeadership(aetcd.Client(host=host, port=int(port)), shard, "doomed", config)
    term = await leadership.acquire()
    print(term.revision, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_trust_ends_a_margin_before_the_lease_could_expire(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    clock = FakeClock()
    paused, standby = make_leadership("paused", clock=clock), make_leadership("standby")
    term = await within(5, paused.acquire())
    standby_acquire = asyncio.create_task(standby.acquire())
    assert await still_pending(standby_acquire)

    # No await between these steps, so no renewal can run: this is a leader frozen since its grant.
    clock.advance(TTL - MARGIN - 0.01)
    assert paused.trusted()
    clock.advance(0.02)
    assert not paused.trusted(), "trust must end at grant + ttl - margin, before etcd could expire the lease"

    await within(1, paused.lost.wait())  # the keepalive task wakes at the window's end and says so
    assert paused.term is None
    assert paused.lost_reason is not None and "trust window" in paused.lost_reason
    # The stale leader frees the key itself, so the standby need not wait for the lease to expire.
    standby_term = await within(1, standby_acquire)
    assert standby_term.revision > term.revision

    # A lost holder can contend again; it gets a fresh, larger token and a cleared `lost`.
    await standby.resign()
    again = await within(5, paused.acquire())
    assert again.revision > standby_term.revision
    assert paused.trusted() and not paused.lost.is_set() and paused.lost_reason is None
    assert await leader_of(observer, config) == ("paused", again.revision)


async def test_leader_whose_renewals_hang_steps_down_before_its_ttl(
    etcd_endpoint: str, make_leadership: MakeLeadership
) -> None:
    host, port = etcd_endpoint.rsplit(":", 1)
    cut_off = aetcd.Client(host=host, port=int(port))
    never = asyncio.Event()

    async def hanging_refresh(lease_id: int) -> Any:  # etcd unreachable for lease traffic
        await never.wait()

    cut_off.refresh_lease = hanging_refresh
    leader = make_leadership("cut-off", client=cut_off)

    started = time.monotonic()
    await within(5, leader.acquire())
    await within(TTL, leader.lost.wait())
    elapsed = time.monotonic() - started
    assert TTL - MARGIN <= elapsed < TTL, f"stepped down after {elapsed:.2f}s"
    assert not leader.trusted()
    assert leader.lost_reason is not None and "trust window" in leader.lost_reason


async def test_leader_notices_when_its_key_changes_hands(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    incumbent, challenger = make_leadership("incumbent"), make_leadership("challenger")
    term = await within(5, incumbent.acquire())
    challenger_acquire = asyncio.create_task(challenger.acquire())
    assert await still_pending(challenger_acquire)

    await observer.delete(config.leader_key(SHARD).encode())  # an operator deletes the key by hand
    challenger_term = await within(1, challenger_acquire)
    await within(config.renew_interval_sec + 1, incumbent.lost.wait())
    assert incumbent.lost_reason == "lease expired or the leader key changed hands"
    assert challenger_term.revision > term.revision
    # The incumbent renews only its own lease: the challenger keeps the shard.
    assert challenger.trusted()
    assert await leader_of(observer, config) == ("challenger", challenger_term.revision)


async def test_standby_whose_watch_history_was_compacted_re_reads_and_still_takes_over(
    etcd_endpoint: str, make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    host, port = etcd_endpoint.rsplit(":", 1)
    standby_client = aetcd.Client(host=host, port=int(port))
    real_watch = standby_client.watch
    compactions = 0

    async def watch_after_compaction(key: bytes, **kwargs: Any) -> Any:
        # etcd compacts between the standby's read and its watch: the watch's start revision is gone.
        nonlocal compactions
        if compactions == 0:
            compactions += 1
            for _ in range(2):  # compacting at revision N keeps N: go past the standby's start revision
                put = await observer.put(config.key_prefix.encode() + b"noise", b"x")
            await observer.compact(put.header.revision)
        return await real_watch(key, **kwargs)

    standby_client.watch = watch_after_compaction
    leader, standby = make_leadership("leader"), make_leadership("standby", client=standby_client)
    term = await within(5, leader.acquire())
    standby_acquire = asyncio.create_task(standby.acquire())
    assert await still_pending(standby_acquire)
    assert compactions == 1

    await leader.resign()
    standby_term = await within(1, standby_acquire)
    assert standby_term.revision > term.revision


async def test_stop_wakes_a_blocked_standby_and_leaves_the_leader_alone(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    leader, standby = make_leadership("leader"), make_leadership("standby")
    term = await within(5, leader.acquire())
    standby_acquire = asyncio.create_task(standby.acquire())
    assert await still_pending(standby_acquire)

    await within(1, standby.stop())
    with pytest.raises(LeadershipStopped):
        await within(1, standby_acquire)
    with pytest.raises(LeadershipStopped):
        await standby.acquire()
    assert leader.trusted()
    assert await leader_of(observer, config) == ("leader", term.revision)


async def test_cancelling_a_blocked_acquire_leaves_the_holder_able_to_contend_again(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    leader, standby = make_leadership("leader"), make_leadership("standby")
    await within(5, leader.acquire())
    standby_acquire = asyncio.create_task(standby.acquire())
    assert await still_pending(standby_acquire)

    standby_acquire.cancel()  # what a dispatcher does with its campaign on shutdown
    await asyncio.wait({standby_acquire}, timeout=1)
    assert standby_acquire.cancelled()
    assert standby.term is None

    await leader.resign()
    term = await within(5, standby.acquire())
    assert await leader_of(observer, config) == ("standby", term.revision)


async def test_stop_and_resign_are_idempotent_and_safe_before_start(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    never_started = make_leadership("idle")
    await never_started.resign()
    await never_started.stop()
    await never_started.stop()
    assert never_started.term is None and not never_started.lost.is_set()

    async with make_leadership("scoped") as scoped:
        await scoped.start()  # start twice is fine
        await within(5, scoped.acquire())
        await scoped.resign()
        await scoped.resign()
        assert await leader_of(observer, config) is None
        await within(5, scoped.acquire())
    assert scoped.lost.is_set() and scoped.lost_reason == "stopped"
    assert await leader_of(observer, config) is None, "leaving the context revokes the lease"
    await scoped.stop()


async def test_try_acquire_and_wait_for_vacancy_let_a_standby_watch_without_contending(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    leader, watcher = make_leadership("leader"), make_leadership("watcher")
    assert await watcher.wait_for_vacancy() > 0, "a vacant shard is reported at once"
    term = await within(5, leader.acquire())
    assert await watcher.try_acquire() is None, "try_acquire never waits and never steals"
    assert await watcher.current_leader() == ("leader", term.revision)

    vacancy = asyncio.create_task(watcher.wait_for_vacancy())
    assert await still_pending(vacancy)
    await leader.resign()
    deleted_at = await within(1, vacancy)
    assert deleted_at > term.revision
    assert await watcher.current_leader() is None, "waiting for a vacancy does not take the shard"
    taken = await watcher.try_acquire()
    assert taken is not None and taken.revision > deleted_at
    assert await leader_of(observer, config) == ("watcher", taken.revision)


async def test_run_as_leader_runs_the_work_only_during_a_term_and_campaigns_again_after_it_ends(
    make_leadership: MakeLeadership, observer: aetcd.Client, config: LeadershipConfig
) -> None:
    started: asyncio.Queue[int] = asyncio.Queue()  # the token of each term the work ran in
    working = asyncio.Event()

    async def work(until: asyncio.Event) -> None:
        current = await leader_of(observer, config)
        assert current is not None
        working.set()
        started.put_nowait(current[1])
        await until.wait()
        working.clear()

    stop = asyncio.Event()
    runner = asyncio.create_task(run_as_leader(stop, make_leadership("singleton"), work, role="test"))
    first = await within(5, started.get())
    # The term ends under it (an operator deletes the key): the work is told to stop, and a new term follows.
    await observer.delete(config.leader_key(SHARD).encode())
    second = await within(5, started.get())
    assert second > first and working.is_set()

    stop.set()
    await within(5, runner)
    assert not working.is_set()
    assert await leader_of(observer, config) is None, "stopping resigns"
