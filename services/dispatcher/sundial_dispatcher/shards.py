"""Leading shards: campaign for the shards this replica should own, stand by for the rest, hand over, rescue.

Every dispatcher replica runs one :class:`ShardCampaign` per shard. The *placement*
(:mod:`sundial_dispatcher.balance`, over the live replicas in the etcd registry) names each shard's
**owner**; leadership itself is still won in etcd (:mod:`sundial_common.coordination.leadership`) and fenced in
Postgres. A campaign is always in one of three phases:

* **Owner, standing by** — this replica should lead the shard. If the leader key is free it creates it
  at once. If another replica leads, it writes a *successor request* (``/sundial/shards/<n>/successor``
  = its id, attached to its registry lease, so it vanishes if this replica dies) and watches the leader
  key; the moment the key is deleted it contends.
* **Not the owner, standing by** — it watches the leader key too, but when the key is deleted it lets
  the owner have it: it waits ``orphan_grace_sec`` (or until the membership changes) and contends only
  if the shard is still leaderless. So a shard whose owner is dead, or not yet known to be dead, is
  never orphaned for longer than the grace.
* **Leading** — it dispatches the shard (the leader work) while its term is trusted. It steps down when
  the term is lost, when the fence rejects a write (a newer leader has written: :class:`FencedOut`),
  when the process stops, or when the shard's owner — another live replica — asks for it with a
  successor request made after this term began. Stepping down finishes the pass in flight, then
  deletes its leader key, and the owner, already watching, leads within a round trip.

Requests older than the term are ignored so that a shard taken over by a rescuer is not bounced back
to a replica that asked before and then failed to take it; the owner asks again when it sees a new term.

A replica joining the registry thus pulls its share of shards from the others, one graceful handover
each; a replica leaving (SIGTERM) removes itself from the registry first, so its shards' new owners
are known before it lets go of them; a replica that dies is replaced when its leases expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aetcd
from sundial_common.broker.kafka import Publisher
from sundial_common.coordination.leadership import LeadershipStopped, ShardLeadership, Term, cancel_watch, first_of
from sundial_common.coordination.registry import ClusterKeys, Membership, ReplicaRegistration
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.hotwindow.window import WAKE_HORIZON_SEC, HotWindow
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncements
from sundial_common.runtime.service import drive
from sundial_common.stores import Stores
from sundial_common.stores.dispatch import FencedOut

from sundial_dispatcher.backfills import BackfillConfig, BackfillDispatcher
from sundial_dispatcher.balance import placement
from sundial_dispatcher.dispatcher import DispatcherConfig, DispatchResult, ShardDispatcher
from sundial_dispatcher.fairness import FairDispatch, OpenWork
from sundial_dispatcher.group_commit import GroupCommit, on_grid
from sundial_dispatcher.limits import SideLimits
from sundial_dispatcher.metrics import Leadership, ShardPassMetrics
from sundial_dispatcher.published_marks import PublishedMarks
from sundial_dispatcher.side_work import SideWork
from sundial_dispatcher.tenancy import TenantPolicy
from sundial_dispatcher.triggers import TriggerConfig, TriggerDispatcher
from sundial_dispatcher.wakes import WakeListener

__all__ = [
    "CampaignConfig",
    "Dependencies",
    "LeaderWork",
    "Placement",
    "ShardCampaign",
    "Tenure",
    "dispatch_work",
]

log = logging.getLogger(__name__)

# How often a waiting owner or leader re-reads etcd without a watch event (a watch stream can die silently).
_RECHECK_SEC = 10.0
# After an etcd error, wait this long before trying again.
_RETRY_SEC = 0.5
# Longest wait between failed dispatch passes (Postgres, Redis or the broker down).
_MAX_PASS_BACKOFF_SEC = 0.5


@dataclass(frozen=True)
class Dependencies:
    stores: Stores
    hot_window: HotWindow
    publisher: Publisher
    etcd: aetcd.Client
    #: Wake-ups for members added to a sleeping leader's window (None: leaders look every poll interval).
    wakes: WakeListener | None = None
    #: The process's look for dependency triggers and backfills (None: each leader looks on its own).
    side_work: SideWork | None = None


@dataclass(frozen=True)
class CampaignConfig:
    """How a replica campaigns.

    shards: number of shards (every process must agree).
    orphan_grace_sec: how long a shard must stay leaderless before a replica that does not own it takes
        it over; the owner, watching the same key, normally leads within milliseconds of the vacancy.
    """

    shards: int
    orphan_grace_sec: float = 1.0

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        if not self.orphan_grace_sec > 0:
            raise ValueError(f"orphan_grace_sec must be > 0, got {self.orphan_grace_sec!r}")


class Placement:
    """The owner of each shard under the current membership (recomputed only when the members change)."""

    def __init__(self, membership: Membership, shards: int) -> None:
        self._membership = membership
        self._shards = shards
        self._members: tuple[str, ...] | None = None
        self._owners: dict[int, str] = {}

    def owner(self, shard: int) -> str | None:
        members = self._membership.members
        if members != self._members:
            self._owners = placement(self._shards, members) if members else {}
            self._members = members
        return self._owners.get(shard)


@dataclass(frozen=True)
class Tenure:
    """What leader work sees of its term: keep working while ``active()``; ``pause`` between passes."""

    term: Term
    leadership: ShardLeadership
    #: Set when the process stops or the shard is being handed over: finish the pass in flight and return.
    step_down: asyncio.Event
    gauges: Leadership | None = None

    def took(self, token: int) -> None:
        """The term has taken its shard in Postgres with fencing token ``token``: say so (log, gauge)."""
        shard = self.term.shard
        log.info("shard %d: leading with fence token %d", shard, token, extra={"shard": shard, "fence_token": token})
        if self.gauges is not None:
            self.gauges.leading(token)

    def active(self) -> bool:
        return not self.step_down.is_set() and self.leadership.trusted()

    async def pause(self, seconds: float, *wake: asyncio.Event) -> None:
        """Wait ``seconds``, or less if the term ends, the work must step down or one of ``wake`` is set."""
        await first_of(asyncio.sleep(seconds), self.step_down, self.leadership.lost, *wake)


LeaderWork = Callable[[Tenure], Awaitable[None]]
"""The work done while leading a shard. Returns when ``tenure.active()`` turns false; may raise FencedOut."""


def dispatch_work(deps: Dependencies, config: DispatcherConfig, holder: str) -> LeaderWork:
    """The dispatcher's leader work: run dispatch passes on the shard for as long as the term allows."""

    tenants = TenantPolicy(deps.stores.tenants)  # one registry view for every shard this replica leads
    # And one read of the open executions (and of the workers' free slots).
    open_work = OpenWork(deps.stores.tenants, config.fairness, live=WorkerAnnouncements(deps.hot_window.redis))
    commits = GroupCommit(deps.stores.dispatch)  # and one dispatch transaction for the passes that coincide
    marks = PublishedMarks(deps.stores.dispatch, config.mark_published_after_sec, config.mark_published_every_sec)
    # The same limits for children and backfills (sundial_dispatcher.limits); none when fairness is off.
    limits = (
        SideLimits(tenants, open_work, TokenBuckets(deps.hot_window.redis), config.shards, config.batch_size)
        if config.fairness.enabled
        else None
    )

    async def work(tenure: Tenure) -> None:
        shard = tenure.term.shard
        token = await _take_shard(deps, tenure, holder)
        if token is None:
            return
        tenure.took(token)
        fair = (
            FairDispatch(
                shard,
                deps.hot_window,
                deps.stores.tenants,
                tenants,
                TokenBuckets(deps.hot_window.redis),
                config.fairness,
                config.batch_size,
                config.shards,
                open_work,
            )
            if config.fairness.enabled
            else None
        )
        dispatcher = ShardDispatcher(
            shard,
            token,
            holder,
            deps.stores.dispatch,
            deps.hot_window,
            deps.publisher,
            config,
            tenants=tenants,
            fair=fair,
            commit=commits,
            marks=marks,
        )
        # Dependent jobs' fires and backfills (sundial_dispatcher.triggers, .backfills): same term and fence.
        triggers = TriggerDispatcher(
            shard,
            token,
            holder,
            deps.stores.dependencies,
            deps.stores.dispatch,
            deps.publisher,
            TriggerConfig(),
            limits=limits,
        )
        backfills = BackfillDispatcher(
            shard,
            token,
            holder,
            deps.stores.backfills,
            deps.stores.dispatch,
            deps.publisher,
            BackfillConfig(),
            limits=limits,
        )
        metrics = ShardPassMetrics(shard)
        alarm = deps.wakes.alarm(shard) if deps.wakes is not None else None
        if deps.side_work is not None:  # idle, the process's census looks for them (sundial_dispatcher.side_work)
            deps.side_work.watch(shard, tenure.active, triggers.cadence, backfills.cadence, alarm)
        claims: deque[tuple[float, int]] = deque()  # (pass start, members claimed) over the last second
        started = 0.0

        async def one_pass() -> DispatchResult:
            """The dispatch pass, then the dependency triggers and backfills when their cadence says."""
            nonlocal started
            try:
                if alarm is not None:
                    alarm.awake()  # from here on, any member announced for this shard wakes the next pause
                started = time.perf_counter()
                result = await dispatcher.run_once()
                metrics.passed(time.perf_counter() - started, result.claimed)
                await triggers.run_if_due()
                await backfills.run_if_due()
            except FencedOut:
                if fair is not None:  # its buffer is the next leader's to claim again (the overdue scan)
                    fair.forget()
                raise
            return result

        def wait_after(result: DispatchResult) -> float | None:
            """How long the leader sleeps after a pass (None: a full batch, or a burst's head: the next at once)."""
            if result.claimed >= config.batch_size or result.again:
                return None
            wait = idle_wait(
                dispatcher.clock.now(),
                dispatcher.next_look(),
                min(triggers.cadence.next_run_in(), backfills.cadence.next_run_in()),
                config.poll_interval_sec,
                deps.wakes is not None and deps.wakes.listening,
            )
            # Scheduled retries do not make a shard dense: a re-drive's 500/s would take the publish lead from the
            # shard's first fires, each then committed at its instant behind the re-drive's passes.
            claims.append((started, result.claimed - result.retried))
            while claims and claims[0][0] < started - 1.0:
                claims.popleft()
            rate = sum(n for _, n in claims)  # members claimed over the last second
            dense = rate > config.dense_per_sec
            if dense:  # dense: batch (DispatcherConfig.dense_per_sec, dense_batch)
                wait = max(wait, dense_wait(rate, started, time.perf_counter(), config))
            dispatcher.sparse(not dense)  # a sparse shard's passes take members ahead (publish_lead_sec)
            if not dense:
                wait = on_grid(wait, (dispatcher.lead - dispatcher.look_lead).total_seconds(), time.time())
            if alarm is not None:
                # In due instants, as members are announced: the pass comes the publish lead before them.
                alarm.plan((time.time() + dispatcher.look_lead.total_seconds() + wait) * 1000)
            return wait

        async def pause(seconds: float) -> None:
            await (tenure.pause(seconds) if alarm is None else tenure.pause(seconds, alarm.ring))

        def failed(_exc: Exception, _failures: int, delay: float) -> None:
            # Postgres, Redis or the broker is unreachable: keep the term (nobody else could do better) and retry
            # soon; the pass has put back what it claimed. The backoff is capped low so that dispatch resumes
            # within half a second of the outage's end.
            log.exception("shard %d: dispatch pass failed; retrying in %.1fs", shard, delay, extra={"shard": shard})

        await drive(
            one_pass,
            active=tenure.active,
            pause=pause,
            wait_after=wait_after,
            retry_after=lambda failures: min(0.1 * 2**failures, _MAX_PASS_BACKOFF_SEC),
            on_failure=failed,
            fatal=(FencedOut,),
            pause_after_failure=tenure.pause,
        )
        if fair is not None:  # the term ended: what it claimed and did not dispatch goes back for the next leader
            with contextlib.suppress(Exception):  # best effort: the hydrator's overdue scan recovers them anyway
                await fair.release()
        if not tenure.step_down.is_set() and not tenure.leadership.trusted():
            log.warning(
                "shard %d: term no longer trusted (%s); stopped dispatching",
                shard,
                tenure.leadership.lost_reason or "trust window ended",
                extra={"shard": shard},
            )

    return work


def idle_wait(
    now: datetime, next_look: datetime | None, side_work_in: float, poll_interval: float, woken: bool
) -> float:
    """Seconds a pass that took less than a batch may sleep: until the earliest member (or held occurrence) is
    due, so it is claimed at its instant rather than on a poll tick, and until the triggers' or backfills' next
    run. A member that came due while the pass ran is claimed at once: sleeping a poll interval for it was most of
    A 333/s spread's dispatch stage (a shard's member every 24 ms, a pass ~25 ms long; 2 passes in 3 then waited 50 ms).

    With wake-ups (members added due sooner are announced) at most :data:`WAKE_HORIZON_SEC`; without, the poll
    interval. Due work waiting for room in the fair buffer is looked at every poll interval (its ``next_look``).
    """
    wait = min(WAKE_HORIZON_SEC if woken else poll_interval, max(side_work_in, 0.0))
    if next_look is not None:
        until = (next_look - now).total_seconds()
        # +1 ms: a claim takes members scored at or before now in whole milliseconds.
        wait = min(wait, until + 0.001 if until > 0 else 0.0)
    return wait


def dense_wait(rate: float, started: float, now: float, config: DispatcherConfig) -> float:
    """Seconds a dense shard's pass (started at ``started``, ``rate`` members claimed a second) waits for the next.

    Its passes are spaced to take about ``dense_batch`` members each, ``poll_interval_sec`` to
    ``dense_max_interval_sec`` (if longer) apart, in whole poll intervals and on the grid of the process's
    monotonic clock: the dense shards of one process then pass at the same instants and their claims share one
    transaction (:mod:`sundial_dispatcher.group_commit`). A pass that took longer than the spacing is followed at
    once, not at the next grid point.
    """
    poll = config.poll_interval_sec
    spacing = min(config.dense_batch / rate, config.dense_max_interval_sec)
    spacing = max(round(spacing / poll), 1) * poll
    if now - started >= spacing:
        return 0.0
    return spacing - now % spacing


async def _take_shard(deps: Dependencies, tenure: Tenure, holder: str) -> int | None:
    """Begin the term in Postgres: its fencing token (see :mod:`sundial_common.coordination.leadership`), or None if the
    term ended before Postgres could be reached."""
    shard = tenure.term.shard
    failures = 0
    while tenure.active():
        try:
            return await deps.stores.dispatch.take_shard(shard, holder)
        except Exception as exc:
            failures += 1
            delay = min(0.1 * 2**failures, _MAX_PASS_BACKOFF_SEC)
            log.warning("shard %d: cannot take the shard in Postgres (%r); retrying in %.1fs", shard, exc, delay)
            await tenure.pause(delay)
    return None


async def _slept(seconds: float) -> bool:
    await asyncio.sleep(seconds)
    return True


class ShardCampaign:
    """One replica's campaign for one shard (see the module docstring). ``run(stop)`` until stopped."""

    def __init__(
        self,
        shard: int,
        leadership: ShardLeadership,
        *,
        me: str,
        etcd: aetcd.Client,
        membership: Membership,
        placement: Placement,
        registration: ReplicaRegistration,
        work: LeaderWork,
        config: CampaignConfig,
        keys: ClusterKeys | None = None,
    ) -> None:
        self.shard = shard
        self.leadership = leadership
        self.me = me
        self._etcd = etcd
        self._membership = membership
        self._placement = placement
        self._registration = registration
        self._work = work
        self._config = config
        self._successor_key = (keys or ClusterKeys()).successor(shard)
        self._extra = {"shard": shard}
        self._leader_gauges = Leadership(shard, me)

    def owns(self) -> bool:
        return self._placement.owner(self.shard) == self.me

    async def run(self, stop: asyncio.Event) -> None:
        async with self.leadership:
            while not stop.is_set():
                try:
                    term = await self._campaign(stop)
                except LeadershipStopped:
                    return
                except (aetcd.ClientError, TimeoutError) as exc:
                    log.warning("shard %d: etcd error while standing by: %r", self.shard, exc, extra=self._extra)
                    await first_of(asyncio.sleep(_RETRY_SEC), stop)
                    continue
                if term is None:
                    return
                await self._lead(stop, term)

    # -- standing by ---------------------------------------------------------------------------------

    async def _campaign(self, stop: asyncio.Event) -> Term | None:
        """Return a term once this replica leads the shard; None when stopping."""
        while not stop.is_set():
            changed = self._membership.changed()
            if self.owns():
                term = await self._stand_by_as_owner(stop, changed)
            else:
                term = await self._stand_by_for_orphan(stop, changed)
            if term is not None:
                return term
        return None

    async def _stand_by_as_owner(self, stop: asyncio.Event, changed: asyncio.Event) -> Term | None:
        """Contend now; while another replica leads, ask it to hand over and wait for the key to go."""
        asked_at = 0  # revision of our successor request; it must be newer than the term it is meant for
        try:
            while not (stop.is_set() or changed.is_set()):
                term = await self.leadership.try_acquire()
                if term is not None:
                    return term
                current = await self.leadership.current_leader()
                if current is None:
                    continue  # freed between the two reads: try again
                holder, token = current
                if asked_at < token and (asked_at := await self._ask_for_handover()):
                    log.info(
                        "shard %d: owned here but led by %s (token %d); asked for a handover",
                        self.shard,
                        holder,
                        token,
                        extra=self._extra,
                    )
                # Wakes when the leader key is deleted, or the membership changes (we may no longer own it).
                await first_of(self.leadership.wait_for_vacancy(), stop, changed)
            return None
        finally:
            if asked_at:
                await asyncio.shield(self._withdraw_handover_request())

    async def _stand_by_for_orphan(self, stop: asyncio.Event, changed: asyncio.Event) -> Term | None:
        """Not the owner: lead only a shard that stays leaderless for the grace period."""
        vacant_at = await first_of(self.leadership.wait_for_vacancy(), stop, changed)
        if vacant_at is None:
            return None
        # The vacancy may come from a replica that just left the registry (a graceful stop deregisters
        # first, then resigns): see the registry at least as of the vacancy before deciding who owns it.
        await self._membership.catch_up(vacant_at)
        if changed.is_set() or self.owns():
            return None  # re-evaluate: we may be the owner now
        if await first_of(_slept(self._config.orphan_grace_sec), stop, changed) is None:
            return None
        term = await self.leadership.try_acquire()
        if term is not None:
            log.warning(
                "shard %d: took over a shard left without a leader for %.1fs (its owner is %s)",
                self.shard,
                self._config.orphan_grace_sec,
                self._placement.owner(self.shard) or "nobody: no live replica is registered",
                extra=self._extra,
            )
        return term

    async def _ask_for_handover(self) -> int:
        """Put the successor request; its revision, or 0 if it could not be attached to our registry lease."""
        lease = self._registration.lease_id
        if lease is None:
            # Re-registering right now: a request without a lease would outlive us; ask on the next round.
            return 0
        put = await self._etcd.put(self._successor_key, self.me.encode(), lease=lease)
        return int(put.header.revision)

    async def _withdraw_handover_request(self) -> None:
        tx = self._etcd.transactions
        # Bounded: this runs on the way out too, and the request dies with our lease anyway.
        with contextlib.suppress(aetcd.ClientError, TimeoutError):
            await asyncio.wait_for(
                self._etcd.transaction(
                    compare=[tx.value(self._successor_key) == self.me.encode()],
                    success=[tx.delete(self._successor_key)],
                    failure=[],
                ),
                _RETRY_SEC * 4,
            )

    # -- leading -------------------------------------------------------------------------------------

    async def _lead(self, stop: asyncio.Event, term: Term) -> None:
        log.info("shard %d: elected (term revision %d)", self.shard, term.revision, extra=self._extra)
        handover = asyncio.Event()
        step_down = asyncio.Event()
        watcher = asyncio.create_task(
            self._await_handover_request(term, handover), name=f"sundial-shard-{self.shard}-handover-watch"
        )
        relay = asyncio.create_task(self._relay(step_down, stop, handover), name=f"sundial-shard-{self.shard}-relay")
        self._leader_gauges.leading()
        try:
            await self._work(Tenure(term, self.leadership, step_down, self._leader_gauges))
        except FencedOut as exc:
            log.error(
                "shard %d: write rejected by the fence (%s): a newer leader has written; stepping down",
                self.shard,
                exc,
                extra={**self._extra, "fence_token": exc.token},
            )
        finally:
            self._leader_gauges.stepped_down()
            for task in (watcher, relay):
                task.cancel()
            # Bounded: stepping down (and handing over) must not wait on an etcd watch that will not end.
            _, stuck = await asyncio.wait({watcher, relay}, timeout=_RETRY_SEC * 4)
            if stuck:
                log.warning("shard %d: %d side tasks did not end; stepping down anyway", self.shard, len(stuck))
            await self.leadership.resign()
        if watcher.done() and not watcher.cancelled() and (died := watcher.exception()) is not None:
            # A leader that can no longer hear handover requests would keep its shards forever: fail loudly.
            raise RuntimeError(f"shard {self.shard}: the handover watch died") from died
        if handover.is_set() and not stop.is_set():
            log.info("shard %d: handed over to %s", self.shard, self._placement.owner(self.shard), extra=self._extra)

    @staticmethod
    async def _relay(step_down: asyncio.Event, *events: asyncio.Event) -> None:
        await first_of(asyncio.Event().wait(), *events)
        step_down.set()

    async def _await_handover_request(self, term: Term, handover: asyncio.Event) -> None:
        """Set ``handover`` once the shard's owner, another live replica, asks for it during this term.

        The request key is read, then watched from that read; it is read again on every watch event, on every
        membership change and every ``_RECHECK_SEC`` (a watch can die silently), while the watch stays open:
        watching anew at each recheck cost etcd a watch create and a cancel per led shard every 10 s.
        """
        key = self._successor_key
        while True:
            try:
                found = await self._etcd.get_range(key, key + b"\0")
                watch = await self._etcd.watch(
                    key, start_revision=int(found.header.revision) + 1, kind=aetcd.EventKind.PUT
                )
                try:
                    while True:
                        changed = self._membership.changed()
                        if self._asks_for_handover(found, term):
                            handover.set()
                            return
                        # A timer event rather than wait_for() around first_of(): a handover watch cancelled
                        # while in wait_for() was seen stuck "cancelling" for good, and the replica could not
                        # step down.
                        recheck = asyncio.Event()
                        timer = asyncio.get_running_loop().call_later(_RECHECK_SEC, recheck.set)
                        try:
                            # A wait that loses to the others leaves the watch's events queued for the next.
                            await first_of(anext(aiter(watch)), changed, recheck)
                        finally:
                            timer.cancel()
                        found = await self._etcd.get_range(key, key + b"\0")
                except StopAsyncIteration:
                    pass  # the watch was cancelled under us: read and watch anew
                finally:
                    await cancel_watch(watch)
            except aetcd.ClientError as exc:
                log.warning("shard %d: cannot watch for handover requests: %r", self.shard, exc, extra=self._extra)
                await asyncio.sleep(_RETRY_SEC)

    def _asks_for_handover(self, found: Any, term: Term) -> bool:
        """The request read in ``found`` comes from the shard's owner, another replica, after ``term`` began."""
        if not found:
            return False
        request = found[0]
        successor = request.value.decode(errors="replace")
        return bool(
            successor != self.me
            and request.mod_revision > term.revision
            and self._placement.owner(self.shard) == successor
        )
