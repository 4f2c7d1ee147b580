"""A ``sundial services`` host's one lease, against a real etcd: the roles it hosts register and lead on it.

What a user of the cluster would notice: every hosted role is registered and leads, each under its own entry and
leader key; a role that resigns frees its key for another host and the others keep theirs; a host whose lease is
gone (frozen past its TTL) loses every term at once and comes back with every entry; a host that is done leaves
nothing behind. ttl 2 s (etcd's minimum), margin 0.5 s, as in ``test_shared_lease``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

import aetcd
import pytest
from sundial_common.host_lease import HostedRegistration, HostLease
from sundial_common.leadership import LeadershipConfig, ShardLeadership
from sundial_common.registry import ClusterKeys, ReplicaRecord

T = TypeVar("T")
TTL = 2.0
ROLES = ("hydrator", "sweeper")


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[aetcd.Client]:
    host, port = etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        yield client


class Host:
    """A host of two roles: one client, one lease, an entry and a leadership per role."""

    def __init__(self, name: str, client: aetcd.Client, keys: ClusterKeys) -> None:
        self.name = name
        self.lease = HostLease(client, ttl_sec=TTL, keys=keys)
        self.entries: dict[str, HostedRegistration] = {
            role: self.lease.entry(ReplicaRecord.for_this_process(role, name)) for role in ROLES
        }
        self.leaderships = {
            role: ShardLeadership(
                client,
                0,
                name,
                LeadershipConfig(ttl_sec=TTL, margin_sec=0.5, key_prefix=keys.role_prefix(role)),
                lease=self.lease,
            )
            for role in ROLES
        }
        self.stop = asyncio.Event()
        self.renewals: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for entry in self.entries.values():
            await entry.register()
        self.renewals = asyncio.create_task(self.lease.run(self.stop))

    async def close(self) -> None:
        for leadership in self.leaderships.values():
            await leadership.stop()
        for entry in self.entries.values():
            await entry.deregister()
        self.stop.set()
        if self.renewals is not None:
            await self.renewals
        await self.lease.revoke()


@pytest.fixture
async def clients(etcd_endpoint: str) -> AsyncIterator[list[aetcd.Client]]:
    host, port = etcd_endpoint.rsplit(":", 1)
    made = [aetcd.Client(host=host, port=int(port)) for _ in range(2)]
    yield made
    for client in made:
        await client.close()


@pytest.fixture
def keys() -> ClusterKeys:
    return ClusterKeys(root=f"/sundial-test-host-lease-{uuid.uuid4().hex}/")


async def _within(seconds: float, aw: asyncio.Future[T] | asyncio.Task[T]) -> T:
    return await asyncio.wait_for(aw, seconds)


async def test_every_hosted_role_registers_and_leads_on_one_lease_that_outlives_several_ttls(
    clients: list[aetcd.Client], etcd: aetcd.Client, keys: ClusterKeys
) -> None:
    host = Host("host-a", clients[0], keys)
    await host.start()
    try:
        terms = {role: await asyncio.wait_for(host.leaderships[role].acquire(), 5) for role in ROLES}
        assert {term.lease_id for term in terms.values()} == {host.lease.lease_id}
        await asyncio.sleep(TTL * 2)  # renewed by the host alone
        for role in ROLES:
            entry = await etcd.get(keys.replica(role, "host-a"))
            key = await etcd.get(LeadershipConfig(key_prefix=keys.role_prefix(role)).leader_key(0).encode())
            assert entry is not None and entry.lease == host.lease.lease_id
            assert key is not None and key.create_revision == terms[role].revision
            assert host.leaderships[role].trusted()
    finally:
        await host.close()
    assert not list(await etcd.get_prefix(keys.root.encode())), "a host that is done leaves nothing"


async def test_a_role_that_resigns_goes_to_the_other_host_and_the_rest_stay(
    clients: list[aetcd.Client], etcd: aetcd.Client, keys: ClusterKeys
) -> None:
    a, b = Host("host-a", clients[0], keys), Host("host-b", clients[1], keys)
    await a.start()
    await b.start()
    try:
        for role in ROLES:
            await asyncio.wait_for(a.leaderships[role].acquire(), 5)
        waiting = asyncio.create_task(b.leaderships["sweeper"].acquire())
        await asyncio.sleep(0.2)
        assert not waiting.done()

        await a.leaderships["sweeper"].resign()
        taken = await _within(3, waiting)
        assert taken.holder == "host-b"
        assert a.leaderships["hydrator"].trusted() and not a.leaderships["hydrator"].lost.is_set()
        entry = await etcd.get(keys.replica("sweeper", "host-a"))
        assert entry is not None and entry.lease == a.lease.lease_id, "resigning a role keeps the host registered"
    finally:
        await a.close()
        await b.close()


async def test_a_lost_lease_ends_every_hosted_term_and_the_host_comes_back_with_every_entry(
    clients: list[aetcd.Client], etcd: aetcd.Client, keys: ClusterKeys
) -> None:
    host = Host("host-a", clients[0], keys)
    await host.start()
    try:
        terms = {role: await asyncio.wait_for(host.leaderships[role].acquire(), 5) for role in ROLES}
        old = terms["hydrator"].lease_id

        await etcd.revoke_lease(old)  # what etcd does to a host frozen or cut off past its TTL

        for role in ROLES:
            await asyncio.wait_for(host.leaderships[role].lost.wait(), TTL * 3)
        while host.lease.lease_id in (None, old):
            await asyncio.wait_for(host.lease.renewal().wait(), TTL * 3)
        for role in ROLES:
            entry = await etcd.get(keys.replica(role, "host-a"))
            assert entry is not None and entry.lease == host.lease.lease_id
        again = await asyncio.wait_for(host.leaderships["sweeper"].acquire(), 5)
        assert again.lease_id == host.lease.lease_id != old
    finally:
        await host.close()
