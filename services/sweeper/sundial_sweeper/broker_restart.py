"""Scan (r) of the sweeper: the broker restarted empty — send every PENDING execution's message again, at once.

A broker that comes back without its data (memory storage, a new cluster, wiped disks) has lost every message
it had acknowledged and no worker had started yet. The outbox scan (b) would find them only once they have
waited ``unstarted_after_sec`` (60 s), a window that cannot be shortened without re-sending every message
legitimately waiting in a backlog. So the restart itself is the trigger: each pass asks the broker whether it
is still the incarnation we knew (:class:`~sundial_common.broker.kafka.BrokerIncarnation`, one watermark read), and
when it is not, every PENDING execution is published again, in pages of ``batch_size``, right away.

A republish that fails (a broker just back may refuse produce requests for a moment) is tried again at the
next pass, for those executions only, rather than left to the outbox scan's window.

Republishing everything PENDING also re-sends the few messages the new broker did receive between its start
and this pass: harmless, the worker's PENDING→RUNNING compare-and-swap lets one delivery run.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from uuid import UUID

from asyncpg import Record
from sundial_common.broker.kafka import BrokerIncarnation, Publisher
from sundial_common.broker.outbox import OutboxSender
from sundial_common.observability.tracing import traceparent
from sundial_common.stores.dispatch import DispatchStore

# The outbox scan's own message and span builders: a republish after a restart is the same send.
from sundial_sweeper.resends import execution_message, send_span

log = logging.getLogger(__name__)

#: Pages looked at per restart, at most (the rest waits for the outbox scan).
_MAX_PAGES = 100


@dataclass(frozen=True)
class BrokerRestartResult:
    #: Whether this pass found a broker that lost its data.
    restarted: bool = False
    republished: int = 0
    publish_failed: int = 0


class BrokerRestartRepublisher:
    """``run_once()``: notice a broker restarted empty and republish every PENDING execution."""

    def __init__(
        self, store: DispatchStore, publisher: Publisher, incarnation: BrokerIncarnation, batch_size: int = 1000
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.sender = OutboxSender(publisher, "republish")
        self.incarnation = incarnation
        self.batch_size = batch_size
        #: Executions whose republish failed: sent again at the next pass (bounded by the pages of one restart).
        self._unsent: list[UUID] = []

    async def run_once(self) -> BrokerRestartResult:
        lost = await asyncio.to_thread(self.incarnation.lost_its_data)
        if not lost:
            return await self._send_unsent()
        self._unsent = []
        sent = failed = 0
        after = UUID(int=0)
        for _ in range(_MAX_PAGES):
            rows = await self.store.pending_after(after, self.batch_size)
            if not rows:
                break
            ok = await self._send(rows)
            sent += ok
            failed += len(rows) - ok
            after = rows[-1]["id"]
            if len(rows) < self.batch_size:
                break
        log.warning(
            "the broker restarted empty: republished %d PENDING executions (%d failed; sent again next pass)",
            sent,
            failed,
        )
        return BrokerRestartResult(restarted=True, republished=sent, publish_failed=failed)

    async def _send_unsent(self) -> BrokerRestartResult:
        """Send again, once per pass, what a republish after the restart could not send (a broker just back
        may refuse produce requests for a while): their old messages are gone, and the outbox scan would
        wait ``unstarted_after_sec`` from their first publish."""
        unsent, self._unsent = self._unsent, []
        sent = 0
        for start in range(0, len(unsent), self.batch_size):
            rows = await self.store.pending_among(unsent[start : start + self.batch_size])
            sent += await self._send(rows) if rows else 0
        if unsent:
            log.info("after the broker restart: republished %d more (%d still unsent)", sent, len(self._unsent))
        return BrokerRestartResult(republished=sent, publish_failed=len(self._unsent))

    async def _send(self, rows: list[Record]) -> int:
        """Publish ``rows`` again; how many were sent (the others are kept for the next pass)."""
        spans = [send_span(row, "republish after broker restart") for row in rows]
        messages = [
            execution_message(row, traceparent(span) or row["traceparent"])
            for row, span in zip(rows, spans, strict=True)
        ]
        sent = await self.sender.send(messages, [row["id"] for row in rows], spans, mark=self.store.republished)
        done = set(sent.sent)
        self._unsent += [row["id"] for row in rows if row["id"] not in done]
        return len(sent.sent)
