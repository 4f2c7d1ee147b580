"""Dispatcher campaigns against a real etcd, with in-process replicas whose leader work only records terms.

Each replica has its own etcd client, registry entry, membership view and one campaign per shard, as a
``sundial dispatcher`` process does. Because every replica runs in this event loop, the tests can watch
leadership exactly: ``Ledger`` records each tenure's start and end, so "never two leaders of a shard at
once" is checked at every instant, not sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import aetcd
import pytest
from sundial_common.coordination.leadership import LeadershipConfig, ShardLeadership
from sundial_common.coordination.registry import ClusterKeys, Membership, ReplicaRecord, ReplicaRegistration
from sundial_common.stores.dispatch import FencedOut
from sundial_dispatcher.balance import placement
from sundial_dispatcher.shards import CampaignConfig, Placement, ShardCampaign, Tenure

T = TypeVar("T")
SHARDS = 8
TTL = 2.0
MARGIN = 0.5
GRACE = 0.5


@dataclass
class Ledger:
    """Who leads what, as the leader work itself reports it."""

    leading: dict[int, str] = field(default_factory=dict)
    terms: list[tuple[int, str, int, float]] = field(default_factory=list)  # (shard, replica, token, started)
    ended: dict[int, float] = field(default_factory=dict)  # shard -> when its last tenure ended
    gaps: list[float] = field(default_factory=list)  # handover gaps: previous tenure's end -> next one's start
    violations: list[str] = field(default_factory=list)
    fence_out: set[tuple[str, int]] = field(default_factory=set)  # (replica, shard) whose next pass is fenced

    def owners(self) -> dict[int, str]:
        return dict(self.leading)


async def eventually(check: Callable[[], T], within: float = 10.0, what: str = "condition") -> T:
    deadline = time.monotonic() + within
    while True:
        if value := check():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {within}s (last: {value!r})")
        await asyncio.sleep(0.01)


class Replica:
    """One in-process dispatcher replica (see the module docstring)."""

    def __init__(self, name: str, endpoint: str, ledger: Ledger, *, campaign: bool = True) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.name = name
        self.etcd = aetcd.Client(host=host, port=int(port))
        self.ledger = ledger
        self.keys = ClusterKeys()
        self.registration = ReplicaRegistration(
            self.etcd, ReplicaRecord.for_this_process("dispatcher", name), ttl_sec=TTL
        )
        self.membership = Membership(self.etcd, "dispatcher")
        self.placement = Placement(self.membership, SHARDS)
        self.campaign = campaign
        self.stop = asyncio.Event()
        self.campaigns_stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def work(self, tenure: Tenure) -> None:
        shard, ledger = tenure.term.shard, self.ledger
        if shard in ledger.leading:
            ledger.violations.append(f"shard {shard}: {self.name} leads while {ledger.leading[shard]} does")
        now = time.monotonic()
        if shard in ledger.ended:
            ledger.gaps.append(now - ledger.ended.pop(shard))
        ledger.leading[shard] = self.name
        ledger.terms.append((shard, self.name, tenure.term.revision, now))
        try:
            while tenure.active():
                if (self.name, shard) in ledger.fence_out:
                    ledger.fence_out.discard((self.name, shard))
                    raise FencedOut(shard, tenure.term.revision)
                await tenure.pause(0.01)
        finally:
            if ledger.leading.get(shard) == self.name:
                del ledger.leading[shard]
                ledger.ended[shard] = time.monotonic()

    async def start(self) -> None:
        await self.membership.catch_up(await self.registration.register())
        self.tasks.append(asyncio.create_task(self.registration.run(self.stop), name=f"{self.name}-registry"))
        self.tasks.append(asyncio.create_task(self.membership.run(self.campaigns_stop), name=f"{self.name}-view"))
        if self.campaign:
            self.start_campaigns()

    def start_campaigns(self) -> None:
        config = LeadershipConfig(ttl_sec=TTL, margin_sec=MARGIN, key_prefix=self.keys.shard_prefix)
        for shard in range(SHARDS):
            campaign = ShardCampaign(
                shard,
                ShardLeadership(self.etcd, shard, self.name, config, lease=self.registration),
                me=self.name,
                etcd=self.etcd,
                membership=self.membership,
                placement=self.placement,
                registration=self.registration,
                work=self.work,
                config=CampaignConfig(shards=SHARDS, orphan_grace_sec=GRACE),
            )
            self.tasks.append(asyncio.create_task(campaign.run(self.campaigns_stop), name=f"{self.name}-{shard}"))

    async def stop_gracefully(self) -> None:
        """What SIGTERM does: leave the registry, then let the campaigns finish and resign, then revoke the lease."""
        self.stop.set()
        await self.registration.leave()
        self.campaigns_stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 10)
        await self.registration.deregister()
        await self.etcd.close()


@pytest.fixture
async def cluster(etcd_endpoint: str) -> AsyncIterator[Callable[..., Awaitable[Replica]]]:
    ledger = Ledger()
    replicas: list[Replica] = []

    async def add(name: str, *, campaign: bool = True) -> Replica:
        replica = Replica(name, etcd_endpoint, ledger, campaign=campaign)
        replicas.append(replica)
        await replica.start()
        return replica

    add.ledger = ledger  # type: ignore[attr-defined]
    yield add
    for replica in replicas:
        if not replica.stop.is_set():
            with contextlib.suppress(Exception):
                await replica.stop_gracefully()
    assert ledger.violations == []


def counts(owners: dict[int, str]) -> dict[str, int]:
    result: dict[str, int] = defaultdict(int)
    for owner in owners.values():
        result[owner] += 1
    return dict(result)


async def test_two_replicas_split_eight_shards_four_and_four(cluster: Callable[..., Awaitable[Replica]]) -> None:
    ledger: Ledger = cluster.ledger  # type: ignore[attr-defined]
    await cluster("alpha")
    await eventually(lambda: len(ledger.owners()) == SHARDS, what="alpha leads all 8 shards")
    assert counts(ledger.owners()) == {"alpha": 8}

    await cluster("beta")
    expected = placement(SHARDS, ["alpha", "beta"])
    await eventually(lambda: ledger.owners() == expected, what="the placement")
    assert counts(ledger.owners()) == {"alpha": 4, "beta": 4}
    # The four shards beta took were handed over: the gap is a round trip, not a failover.
    assert len(ledger.gaps) == 4 and max(ledger.gaps) < 0.5, ledger.gaps


async def test_a_third_replica_takes_its_share_with_bounded_moves_and_no_overlap(
    cluster: Callable[..., Awaitable[Replica]],
) -> None:
    ledger: Ledger = cluster.ledger  # type: ignore[attr-defined]
    await cluster("alpha")
    await cluster("beta")
    two = placement(SHARDS, ["alpha", "beta"])
    await eventually(lambda: ledger.owners() == two, what="the two-replica placement")
    terms_before = len(ledger.terms)

    await cluster("gamma")
    three = placement(SHARDS, ["alpha", "beta", "gamma"])
    await eventually(lambda: ledger.owners() == three, what="the three-replica placement")
    assert sorted(counts(three).values()) == [2, 3, 3]
    moved = sum(1 for shard in range(SHARDS) if two[shard] != three[shard])
    assert len(ledger.terms) - terms_before == moved, "only the shards whose owner changed got a new term"
    assert all(gap < 0.5 for gap in ledger.gaps), ledger.gaps


async def test_a_stopping_replica_hands_its_shards_over_within_half_a_second(
    cluster: Callable[..., Awaitable[Replica]],
) -> None:
    ledger: Ledger = cluster.ledger  # type: ignore[attr-defined]
    alpha = await cluster("alpha")
    await cluster("beta")
    await eventually(lambda: ledger.owners() == placement(SHARDS, ["alpha", "beta"]), what="the placement")
    gaps_before = len(ledger.gaps)

    started = time.monotonic()
    await alpha.stop_gracefully()
    await eventually(lambda: counts(ledger.owners()) == {"beta": 8}, within=5, what="beta leads all shards")
    assert time.monotonic() - started < 1.0
    handovers = ledger.gaps[gaps_before:]
    assert len(handovers) == 4 and max(handovers) < 0.5, handovers


async def test_shards_of_an_owner_that_does_not_take_them_are_rescued_after_the_grace_and_kept(
    cluster: Callable[..., Awaitable[Replica]],
) -> None:
    """An owner that is registered but not campaigning (hung, or still starting) does not orphan its shards:
    another replica takes them once they have been leaderless for the grace period, and keeps them — the
    owner never asked, so nothing bounces back and forth."""
    ledger: Ledger = cluster.ledger  # type: ignore[attr-defined]
    await cluster("zombie", campaign=False)
    started = time.monotonic()
    await cluster("alpha")
    zombie_shards = {s for s, owner in placement(SHARDS, ["alpha", "zombie"]).items() if owner == "zombie"}
    assert len(zombie_shards) == 4
    await eventually(lambda: len(ledger.owners()) == SHARDS, what="alpha leads all shards")
    assert time.monotonic() - started >= GRACE, "the owner gets the first chance"
    rescued_at = {s: at for s, _, _, at in ledger.terms if s in zombie_shards}
    own_at = {s: at for s, _, _, at in ledger.terms if s not in zombie_shards}
    assert min(rescued_at.values()) - max(own_at.values()) >= GRACE * 0.9

    with pytest.raises(AssertionError):  # a bounded negative check: nothing moves for a second
        await eventually(lambda: len(ledger.terms) > SHARDS, within=1.0)
    assert counts(ledger.owners()) == {"alpha": 8}


async def test_an_owner_that_asks_gets_its_shards_from_the_replica_that_rescued_them(
    cluster: Callable[..., Awaitable[Replica]],
) -> None:
    ledger: Ledger = cluster.ledger  # type: ignore[attr-defined]
    late = await cluster("late", campaign=False)
    await cluster("alpha")
    await eventually(lambda: len(ledger.owners()) == SHARDS, what="alpha leads all shards")

    late.start_campaigns()  # it asks for its shards, and alpha hands them over
    expected = placement(SHARDS, ["alpha", "late"])
    await eventually(lambda: ledger.owners() == expected, what="the placement")
    assert max(ledger.gaps) < 0.5, ledger.gaps


async def test_a_fenced_out_leader_steps_down_and_contends_again_with_a_newer_token(
    cluster: Callable[..., Awaitable[Replica]],
) -> None:
    ledger: Ledger = cluster.ledger  # type: ignore[attr-defined]
    await cluster("alpha")
    await cluster("beta")
    await eventually(lambda: ledger.owners() == placement(SHARDS, ["alpha", "beta"]), what="the placement")
    shard = next(s for s, owner in ledger.owners().items() if owner == "beta")
    token_before = max(t for s, _, t, _ in ledger.terms if s == shard)
    ledger.fence_out.add(("beta", shard))  # its next pass is rejected by the fence
    # beta steps down (resigns) and, as the owner, contends again at once: a new term, a newer token.
    await eventually(
        lambda: any(s == shard and r == "beta" and t > token_before for s, r, t, _ in ledger.terms),
        what="beta leads the shard again with a newer token",
    )
    assert ledger.owners()[shard] == "beta"
