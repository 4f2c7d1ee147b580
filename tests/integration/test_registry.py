"""The replica registry against a real etcd: entries come and go with their replicas, views follow them."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aetcd
import pytest
from sundial_common.coordination.registry import (
    ClusterKeys,
    LeftRegistry,
    Membership,
    ReplicaRecord,
    ReplicaRegistration,
)

TTL = 2.0


async def eventually(check: Callable[[], object], within: float = 5.0) -> None:
    """Poll ``check`` (a function, or a coroutine function) until it answers something truthy, or fail after
    ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        result = check()
        value = await result if inspect.isawaitable(result) else result
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {within}s (last: {value!r})")
        await asyncio.sleep(0.02)


@pytest.fixture
async def etcd(etcd_endpoint: str) -> AsyncIterator[aetcd.Client]:
    host, port = etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        yield client


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Awaitable[Any]], asyncio.Task[Any]]]:
    """Start background coroutines; cancel whatever is left at the end."""
    tasks: list[asyncio.Task[Any]] = []

    def start(coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def record(replica_id: str, kind: str = "dispatcher") -> ReplicaRecord:
    return ReplicaRecord.for_this_process(kind, replica_id)


async def test_a_membership_view_follows_replicas_joining_and_leaving(
    etcd: aetcd.Client, running: Callable[[Awaitable[Any]], asyncio.Task[Any]]
) -> None:
    view = Membership(etcd, "dispatcher")
    stop = asyncio.Event()
    running(view.run(stop))
    await eventually(lambda: view.revision > 0)
    assert not view.members

    changed = view.changed()
    alpha = ReplicaRegistration(etcd, record("alpha"), ttl_sec=TTL)
    revision = await alpha.register()
    await asyncio.wait_for(changed.wait(), 5)
    assert view.members == ("alpha",) and view.revision >= revision
    assert view.records["alpha"].kind == "dispatcher" and view.records["alpha"].pid > 0

    beta = ReplicaRegistration(etcd, record("beta"), ttl_sec=TTL)
    await beta.register()
    await eventually(lambda: view.members == ("alpha", "beta"))

    # Another kind lives under another prefix: not a dispatcher.
    await ReplicaRegistration(etcd, record("gamma", "hydrator"), ttl_sec=TTL).register()

    changed = view.changed()
    await alpha.deregister()
    await asyncio.wait_for(changed.wait(), 5)
    assert view.members == ("beta",)
    with pytest.raises(LeftRegistry):
        await alpha.register()
    stop.set()


async def test_catch_up_brings_a_view_to_a_revision_without_waiting_for_the_watch(etcd: aetcd.Client) -> None:
    view = Membership(etcd, "dispatcher")  # not running: no watch at all
    revision = await ReplicaRegistration(etcd, record("alpha"), ttl_sec=TTL).register()
    await view.catch_up(revision)
    assert view.members == ("alpha",) and view.revision >= revision


async def test_renewals_keep_the_entry_and_a_dead_replica_disappears_after_its_ttl(
    etcd: aetcd.Client, running: Callable[[Awaitable[Any]], asyncio.Task[Any]]
) -> None:
    keys = ClusterKeys()
    alive = ReplicaRegistration(etcd, record("alive"), ttl_sec=TTL)
    await alive.register()
    stop = asyncio.Event()
    keeper = running(alive.run(stop))

    # Well past its TTL, the entry lives on its lease's renewals alone (the record is written once).
    written = await etcd.get(keys.replica("dispatcher", "alive"))
    assert written is not None
    await asyncio.sleep(TTL * 2)
    kept = await etcd.get(keys.replica("dispatcher", "alive"))
    assert kept is not None and kept.mod_revision == written.mod_revision

    # A replica that registers and then never renews (it was killed) is gone one TTL later.
    doomed = ReplicaRegistration(etcd, record("doomed"), ttl_sec=TTL)
    await doomed.register()
    view = Membership(etcd, "dispatcher")
    await view.refresh()
    assert view.members == ("alive", "doomed")
    await eventually(lambda: _members_after_refresh(view, ("alive",)), within=TTL + 2)

    stop.set()
    await asyncio.wait_for(keeper, 5)  # run() deregisters on the way out
    assert await etcd.get(keys.replica("dispatcher", "alive")) is None


async def test_a_replica_whose_lease_expired_registers_again(
    etcd: aetcd.Client, running: Callable[[Awaitable[Any]], asyncio.Task[Any]]
) -> None:
    keys = ClusterKeys()
    paused = ReplicaRegistration(etcd, record("paused"), ttl_sec=TTL)
    await paused.register()
    old_lease = paused.lease_id
    assert old_lease is not None
    await etcd.revoke_lease(old_lease)  # what etcd does to a replica frozen past its TTL
    assert await etcd.get(keys.replica("dispatcher", "paused")) is None

    stop = asyncio.Event()
    running(paused.run(stop))
    await eventually(lambda: etcd.get(keys.replica("dispatcher", "paused")), within=TTL * 2)
    assert paused.lease_id not in (None, old_lease)
    stop.set()


async def _members_after_refresh(view: Membership, expected: tuple[str, ...]) -> bool:
    await view.refresh()
    return view.members == expected


def test_records_refuse_unknown_kinds_and_ids_that_would_break_keys() -> None:
    with pytest.raises(ValueError, match="unknown replica kind 'dispatch'"):
        ReplicaRecord.for_this_process("dispatch", "a")
    with pytest.raises(ValueError, match="contain no '/'"):
        ReplicaRecord.for_this_process("dispatcher", "a/b")
    original = ReplicaRecord.for_this_process("api", "api-1")
    assert ReplicaRecord.decode(original.encode()) == original
