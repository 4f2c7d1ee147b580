"""Leader keys on the process's registry lease, against a real etcd: one lease for a replica's entry and its terms.

What a user of the cluster would notice: a replica's terms and its entry are kept alive together, a stepping-down
leader frees its shard without leaving the registry, and a replica whose lease is gone loses every term at once
(and a standby leads). ttl 2 s (etcd's minimum), margin 0.5 s, as in ``test_leadership``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aetcd
import pytest
from sundial_common.coordination.leadership import LeadershipConfig, ShardLeadership
from sundial_common.coordination.registry import ClusterKeys, ReplicaRecord, ReplicaRegistration

T = TypeVar("T")
TTL = 2.0
MARGIN = 0.5


async def within(seconds: float, aw: Awaitable[T]) -> T:
    return await asyncio.wait_for(aw, seconds)


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[aetcd.Client]:
    host, port = etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        yield client


@pytest.fixture(params=[False, True], ids=["unfenced", "fenced"])
def config(request: pytest.FixtureRequest) -> LeadershipConfig:
    return LeadershipConfig(
        ttl_sec=TTL,
        margin_sec=MARGIN,
        key_prefix=f"/sundial/test-shared-lease/{uuid.uuid4().hex}/shards/",
        fenced=request.param,
    )


class Process:
    """One replica: its own etcd client, its registry entry, and its leaderships of shards on the entry's lease."""

    def __init__(self, name: str, endpoint: str, config: LeadershipConfig) -> None:
        host, port = endpoint.rsplit(":", 1)
        self.etcd = aetcd.Client(host=host, port=int(port))
        self.registration = ReplicaRegistration(
            self.etcd, ReplicaRecord.for_this_process("dispatcher", name), ttl_sec=TTL
        )
        self.config = config
        self.name = name
        self.stop = asyncio.Event()
        self.leaderships: list[ShardLeadership] = []
        self.renewals: asyncio.Task[None] | None = None

    def leadership(self, shard: int) -> ShardLeadership:
        made = ShardLeadership(self.etcd, shard, self.name, self.config, lease=self.registration)
        self.leaderships.append(made)
        return made

    async def start(self) -> None:
        await self.registration.register()
        self.renewals = asyncio.create_task(self.registration.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        for leadership in self.leaderships:
            await leadership.stop()
        if self.renewals is not None:
            await asyncio.wait({self.renewals})
        await self.registration.deregister()
        await self.etcd.close()


@pytest.fixture
async def processes(etcd_endpoint: str, config: LeadershipConfig) -> AsyncIterator[Callable[[str], Awaitable[Process]]]:
    made: list[Process] = []

    async def start(name: str) -> Process:
        process = Process(name, etcd_endpoint, config)
        made.append(process)
        await process.start()
        return process

    yield start
    for process in made:
        await process.close()


async def test_terms_ride_on_the_registry_lease_and_outlive_several_ttls(
    processes: Callable[[str], Awaitable[Process]], etcd: aetcd.Client, config: LeadershipConfig
) -> None:
    alpha = await processes("alpha")
    shards = [alpha.leadership(shard) for shard in (0, 1)]
    terms = [await within(5, leadership.acquire()) for leadership in shards]
    assert {term.lease_id for term in terms} == {alpha.registration.lease_id}, "one lease for the entry and the terms"

    await asyncio.sleep(TTL * 2)  # renewed by the registration alone
    assert all(leadership.trusted() and not leadership.lost.is_set() for leadership in shards)
    for shard, term in zip((0, 1), terms, strict=True):
        current = await etcd.get(config.leader_key(shard).encode())
        assert current is not None and current.create_revision == term.revision


async def test_resigning_frees_the_shard_for_a_standby_and_keeps_the_replica_registered(
    processes: Callable[[str], Awaitable[Process]], etcd: aetcd.Client, config: LeadershipConfig
) -> None:
    alpha, beta = await processes("alpha"), await processes("beta")
    leader, standby = alpha.leadership(3), beta.leadership(3)
    term = await within(5, leader.acquire())
    waiting = asyncio.create_task(standby.acquire())
    await asyncio.sleep(0.2)
    assert not waiting.done()

    await leader.resign()
    taken = await within(2, waiting)
    assert taken.holder == "beta" and taken.revision > term.revision
    entry = await etcd.get(ClusterKeys().replica("dispatcher", "alpha"))
    assert entry is not None and entry.lease == term.lease_id, "resigning deletes the key, not the process's lease"

    # And the replica can lead again on the same lease once the shard is free.
    await standby.resign()
    again = await within(5, leader.acquire())
    assert again.lease_id == term.lease_id == alpha.registration.lease_id


async def test_a_lost_lease_ends_every_term_of_the_process_and_a_standby_leads(
    processes: Callable[[str], Awaitable[Process]], etcd: aetcd.Client, config: LeadershipConfig
) -> None:
    alpha, beta = await processes("alpha"), await processes("beta")
    leaders = [alpha.leadership(shard) for shard in (0, 1)]
    terms = [await within(5, leadership.acquire()) for leadership in leaders]
    standby = beta.leadership(0)
    waiting = asyncio.create_task(standby.acquire())

    await etcd.revoke_lease(terms[0].lease_id)  # what etcd does to a replica frozen or cut off past its TTL

    taken = await within(3, waiting)
    assert taken.holder == "beta"
    for leadership in leaders:
        await within(TTL * 2, leadership.lost.wait())
        assert not leadership.trusted()
    # The replica registers again on a new lease (its run() renews), and may lead again on it.
    new_lease = await within(TTL * 3, _new_lease(alpha.registration, terms[0].lease_id))
    again = await within(5, leaders[1].acquire())
    assert again.lease_id == new_lease


async def test_a_key_left_on_the_lease_by_an_ended_term_is_cleared_by_the_next_acquire(
    processes: Callable[[str], Awaitable[Process]], etcd: aetcd.Client, config: LeadershipConfig
) -> None:
    alpha = await processes("alpha")
    lease = alpha.registration.lease_id
    assert lease is not None
    key = config.leader_key(5).encode()
    await etcd.put(key, b"alpha", lease=lease)  # a term that ended while etcd could not take its delete

    term = await within(5, alpha.leadership(5).acquire())
    current = await etcd.get(key)
    assert current is not None and current.create_revision == term.revision


async def _new_lease(registration: ReplicaRegistration, old: int) -> int:
    while registration.lease_id in (None, old):
        await registration.renewal().wait()
    lease = registration.lease_id
    assert lease is not None
    return lease
