"""Leading shards: campaign for each shard, dispatch while trusted, step down when the term ends.

Leader-only work is grouped here (CONVENTIONS 5): a :class:`ShardDispatcher` exists only inside a
term and is dropped the moment the term is lost, fenced out, or the process is asked to stop. On
SIGTERM the in-flight pass finishes, then the lease is revoked so a standby leads within moments.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aetcd
from sundial_common.broker import Publisher
from sundial_common.hotwindow import HotWindow
from sundial_common.service import sleep_or_stop
from sundial_common.store import FencedOut, Store

from sundial_dispatcher.dispatcher import DispatcherConfig, ShardDispatcher
from sundial_dispatcher.leadership import LeadershipConfig, LeadershipStopped, ShardLeadership

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dependencies:
    store: Store
    hot_window: HotWindow
    publisher: Publisher
    etcd: aetcd.Client


async def _wait_any(*events: asyncio.Event, seconds: float) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def lead_shard(
    stop: asyncio.Event,
    shard: int,
    holder: str,
    deps: Dependencies,
    config: DispatcherConfig,
    leadership_config: LeadershipConfig,
) -> None:
    """Campaign for ``shard`` until ``stop``; while leading, dispatch it."""
    async with ShardLeadership(deps.etcd, shard, holder, leadership_config) as leadership:
        while not stop.is_set():
            acquiring = asyncio.ensure_future(leadership.acquire())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not acquiring.done():
                acquiring.cancel()
                await asyncio.gather(acquiring, return_exceptions=True)
                return
            try:
                term = acquiring.result()
            except LeadershipStopped:
                return
            log.info("shard %d: leading with fence token %d", shard, term.token, extra={"shard": shard})
            dispatcher = ShardDispatcher(shard, term.token, holder, deps.store, deps.hot_window, deps.publisher, config)
            try:
                await _dispatch_while_trusted(stop, leadership, dispatcher, config)
            except FencedOut as exc:
                log.error("shard %d: %s; stepping down", shard, exc, extra={"shard": shard})
            finally:
                await leadership.resign()


async def _dispatch_while_trusted(
    stop: asyncio.Event, leadership: ShardLeadership, dispatcher: ShardDispatcher, config: DispatcherConfig
) -> None:
    failures = 0
    while not stop.is_set() and leadership.trusted():
        try:
            result = await dispatcher.run_once()
            failures = 0
        except FencedOut:
            raise
        except Exception:
            # Postgres, Redis or the broker is unreachable: keep the term (nobody else could do
            # better) and retry with backoff. Claimed members are recovered by the hydrator.
            failures += 1
            delay = min(0.1 * 2**failures, 5.0)
            log.exception("shard %d: dispatch pass failed; retrying in %.1fs", dispatcher.shard, delay)
            if await sleep_or_stop(stop, delay):
                return
            continue
        if result.claimed < config.batch_size:
            await _wait_any(stop, leadership.lost, seconds=config.poll_interval_sec)
    if not stop.is_set() and not leadership.trusted():
        log.warning(
            "shard %d: term no longer trusted (%s); stopped dispatching",
            dispatcher.shard,
            leadership.lost_reason or "trust window ended",
        )
