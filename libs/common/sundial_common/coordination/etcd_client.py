"""The etcd client of every Sundial process: aetcd's, with lease renewals on one long-lived stream.

aetcd's ``refresh_lease`` opens a new ``LeaseKeepAlive`` bidi stream for each renewal and drops it after
the first reply. Every leased thing renews every ``ttl / 3`` (a replica's registry entry, each shard or
role it leads), so an idle ``make up`` opened 12.6 streams a second (etcd's ``grpc_server_started_total``);
setting one up is most of what a renewal costs on both sides (py-spy: ``StreamStreamCall._prepare_rpc`` was
a quarter of an idle analytics replica's samples). :class:`Client` keeps one stream open per client and
sends every renewal on it, matching replies by lease id; the behaviour seen by callers is the same
(the reply, TTL 0 for a lease etcd no longer has, an ``aetcd.ClientError`` when etcd cannot be reached).

A stream that fails, ends, or lets a renewal go unanswered for the client's call timeout (or until its
caller gave up, if sooner) is dropped, and the next renewal opens a fresh one: a stream
stuck on a half-dead connection can delay renewals by one deadline, never stop them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from typing import Any

import aetcd
from aetcd import exceptions, rpc
from grpc.aio import EOF

__all__ = ["Client"]

log = logging.getLogger(__name__)


class _KeepAliveStream:
    """One open ``LeaseKeepAlive`` call and the renewals waiting for their reply on it."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.waiting: defaultdict[int, deque[asyncio.Future[Any]]] = defaultdict(deque)
        self.write_lock = asyncio.Lock()
        self.broken = False
        self.reader = asyncio.create_task(self._read(), name="sundial-etcd-lease-keepalive")

    async def _read(self) -> None:
        error: BaseException = exceptions.ConnectionFailedError("the lease keep-alive stream ended")
        try:
            while True:
                reply = await self.call.read()
                if reply is EOF or reply is None:  # the server closed the stream
                    break
                queue = self.waiting.get(int(reply.ID))
                while queue:
                    future = queue.popleft()
                    if not future.done():
                        future.set_result(reply)
                        break
        except asyncio.CancelledError:
            error = exceptions.ConnectionFailedError("the lease keep-alive stream was closed")
        except Exception as exc:  # whatever it was, the renewals waiting must not hang on it
            error = _translated(exc)
        finally:
            self.close(error)

    def close(self, error: BaseException) -> None:
        self.broken = True
        for queue in self.waiting.values():
            for future in queue:
                if not future.done():
                    future.set_exception(error)
        self.waiting.clear()
        if not self.reader.done():
            self.reader.cancel()
        self.call.cancel()


def _translated(error: BaseException) -> aetcd.ClientError:
    """The ``aetcd.ClientError`` aetcd itself raises for ``error`` (an ``AioRpcError`` by its status code)."""
    if not isinstance(error, rpc.AioRpcError | aetcd.ClientError):
        return exceptions.ConnectionFailedError(repr(error))
    try:
        exceptions._handle_exception(error)
    except aetcd.ClientError as translated:
        return translated
    return exceptions.ClientError(repr(error))  # not reached: _handle_exception always raises


class Client(aetcd.Client):  # type: ignore[misc]  # aetcd ships no type information
    """``aetcd.Client`` whose ``refresh_lease`` shares one keep-alive stream (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._keepalive: _KeepAliveStream | None = None
        self._keepalive_lock = asyncio.Lock()

    async def refresh_lease(self, lease_id: int) -> Any:
        stream = await self._stream()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        stream.waiting[lease_id].append(future)
        try:
            try:
                async with stream.write_lock:
                    await stream.call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the call finished under us (grpc: "RPC already finished"), an RpcError
                stream.close(_translated(exc))  # fails this renewal too, as a ClientError
            if not self._timeout:
                return await future
            # aetcd gave each renewal's own stream the client's call timeout; a shared stream keeps that bound
            # per renewal, whatever deadline the caller has (or lacks).
            try:
                return await asyncio.wait_for(asyncio.shield(future), self._timeout)
            except TimeoutError:
                log.warning("lease %x: no keep-alive reply within %ss; reopening the stream", lease_id, self._timeout)
                stream.close(exceptions.ConnectionTimeoutError("lease keep-alive reply overdue"))
                raise exceptions.ConnectionTimeoutError("lease keep-alive reply overdue") from None
        except asyncio.CancelledError:
            # The caller's deadline: a stream that leaves a renewal unanswered that long is not trusted again.
            if not future.done():
                log.warning(
                    "lease %x: no keep-alive reply before the caller's deadline; reopening the stream", lease_id
                )
                stream.close(exceptions.ConnectionTimeoutError("lease keep-alive reply overdue"))
            raise

    async def _stream(self) -> _KeepAliveStream:
        async with self._keepalive_lock:
            # A call that ended before its reader noticed is as broken as one it reported.
            if self._keepalive is None or self._keepalive.broken or self._keepalive.call.done():
                await self.connect()
                assert self.leasestub is not None
                # No deadline on the call itself: it lives as long as the client; each renewal has its own.
                call = self.leasestub.LeaseKeepAlive(metadata=self.metadata)
                self._keepalive = _KeepAliveStream(call)
            return self._keepalive

    async def close(self) -> None:
        stream, self._keepalive = self._keepalive, None
        if stream is not None:
            stream.close(exceptions.ConnectionFailedError("the etcd client was closed"))
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stream.reader
        await super().close()
