"""Lease renewals on one long-lived keep-alive stream (sundial_common.coordination.etcd_client), against the test
etcd."""

from __future__ import annotations

import asyncio
from typing import Any

import aetcd
import pytest
from sundial_common.coordination.registry import etcd_client


async def test_renewals_of_many_leases_share_one_stream_and_each_gets_its_own_answer(etcd_endpoint: str) -> None:
    client = etcd_client(etcd_endpoint)
    try:
        leases = [await client.lease(5) for _ in range(3)]
        first = await client.refresh_lease(leases[0].id)
        stream = client._keepalive
        for _ in range(3):
            replies = await asyncio.gather(*(client.refresh_lease(lease.id) for lease in leases * 2))
            assert [r.ID for r in replies] == [lease.id for lease in leases * 2]
            assert all(r.TTL > 0 for r in replies)
        assert first.TTL > 0 and client._keepalive is stream, "one stream for every renewal"

        await client.revoke_lease(leases[1].id)
        assert (await client.refresh_lease(leases[1].id)).TTL <= 0  # gone: TTL 0, as aetcd's own reports it
    finally:
        await client.close()


async def test_a_stream_that_broke_is_replaced_by_the_next_renewal(
    etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = etcd_client(etcd_endpoint)
    try:
        lease = await client.lease(5)
        await client.refresh_lease(lease.id)
        broken = client._keepalive
        broken.call.cancel()  # what a lost connection does to it; renewed again before the reader noticed
        assert (await asyncio.wait_for(client.refresh_lease(lease.id), 5)).TTL > 0
        assert client._keepalive is not broken

        # The race the fault suite hit: the call finishes after a renewal picked the stream, before it writes.
        # The renewal fails as etcd errors do (callers retry those), and the next one opens a new stream.
        stale = client._keepalive
        stale.call.cancel()

        async def the_stale_stream() -> Any:
            return stale

        monkeypatch.setattr(client, "_stream", the_stale_stream)
        with pytest.raises(aetcd.ClientError):
            await asyncio.wait_for(client.refresh_lease(lease.id), 5)
        monkeypatch.undo()
        assert (await asyncio.wait_for(client.refresh_lease(lease.id), 5)).TTL > 0
    finally:
        await client.close()


async def test_a_renewal_abandoned_at_its_deadline_retires_the_stream_and_the_next_one_opens_another(
    etcd_endpoint: str,
) -> None:
    client = etcd_client(etcd_endpoint)
    try:
        lease = await client.lease(5)
        await client.refresh_lease(lease.id)
        stream = client._keepalive
        abandoned = asyncio.ensure_future(client.refresh_lease(lease.id))
        await asyncio.sleep(0)  # sent (or being sent), its reply not read yet
        abandoned.cancel()  # what the caller's deadline does when no reply comes
        await asyncio.wait({abandoned})
        assert stream.broken, "a stream that left a renewal unanswered is not trusted again"

        assert (await asyncio.wait_for(client.refresh_lease(lease.id), 5)).TTL > 0
        assert client._keepalive is not stream
    finally:
        await client.close()
