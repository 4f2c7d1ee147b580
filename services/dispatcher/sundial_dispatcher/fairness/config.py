"""The knobs of weighted fair dispatch (:mod:`sundial_dispatcher.fairness`), validated where they are built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FairnessConfig:
    #: On by default (``SUNDIAL_DISPATCHER_FAIRNESS``); off: a pass takes the earliest due members, whoever they
    #: belong to (the behaviour before tenants), and the concurrency and dispatch-rate quotas do not act.
    enabled: bool = True
    #: Most executions of one pool waiting in its topic (PENDING) before the passes stop publishing to it;
    #: each shard's pass may fill its share (1/shards) of the room left, so concurrent passes stay under it.
    #: The ceiling of each pool's own cap, which follows its start rate (``pool_queue_sec``).
    pool_queue_cap: int = 1000
    #: A backlogged pool's queue holds about this many seconds of its workers' starts: what is published
    #: behind it (a tenant's ``HIGH`` work, another tenant's) waits at most about that long in the topic.
    #: Twice ``counts_refresh_sec``, so the workers never run dry between two reads of the counts.
    pool_queue_sec: float = 0.5
    #: The smallest cap of a pool. A pool first seen starting work gets the cap of the start rate measured at
    #: that read (not this floor: doubling from 4 held a 333/s spread's first 1.5-2 s back), then follows its workers.
    #: Small: it is what a slow pool's queue holds (8 slots of 1 s handlers: 4 queued is half a second).
    pool_queue_min: int = 4
    #: The cap of a pool whose start rate this process has not measured yet (every pool after a dispatcher start
    #: or a failover, and a new pool) **and no live worker announced**: with workers announced, that cap is their
    #: free slots, what they can start now (:class:`~sundial_dispatcher.fairness.OpenWork`). With a fixed
    #: ``pool_queue_cap`` there, a first burst of 1,000 ``LOW`` jobs went to the topic whole and ``HIGH`` work due
    #: during its drain waited behind all of it (one worker of 1 s handlers: P50 33 s); a fixed small cap instead
    #: held a fast pool's first burst back (10,000 due at once, two workers of 256 slots: lateness P50 0.9 -> 1.8 s).
    #: Small: a pool nobody reads gains nothing from a long queue, and the stalled-pool rule lets its work through after
    #: ``stalled_pool_sec``. Kept within ``pool_queue_min`` .. ``pool_queue_cap``.
    pool_queue_first: int = 8
    #: Scheduled retries may fill a pool's queue to this share of its cap (``pool_queue_sec``), the rest is the
    #: scheduled work's: a bulk re-drive's retries at 500/s kept the shared pool's queue full whenever its
    #: workers fell behind, and another tenant's jobs, first out of the buffer, still waited behind that queue
    #: in the topic. 1: retries may fill it all, as first attempts do.
    retry_queue_share: float = 0.25
    #: Most claimed occurrences one shard leader holds waiting for their turn.
    buffer_cap: int = 200_000
    #: Members claimed from the hot window into the buffer per pass. Deep, so a burst is in the buffer (and
    #: the round robin sees every tenant in it) after one pass: members due at one instant are claimed in id
    #: order, so with 2,000 a pass tenant B's jobs created after A's 12,500 per shard waited 6-7 passes (B's
    #: P50 4.1 s at 50,000 + 100, 1.5 s with 20,000, same quiet machine). A claim this deep happens once
    #: per burst; a steady stream claims only what is due, far less.
    claim_size: int = 20_000
    #: A burst is claimed ahead of its due time: when at least ``claim_ahead_min`` members of a shard are due
    #: within ``claim_ahead_sec``, a pass claims them (and looks up whose they are) before they are due, and
    #: holds them until then. Claiming 4 x 12,500 members took ~1.4 s of passes on a loaded machine (4 x 25,000:
    #: two claims a shard, more than 3 s): paid at due time, that was the first seconds of every tenant's
    #: lateness in the burst. A steady stream below 1,000 due/s a shard (8,000/s over 8 shards) never reaches
    #: the threshold and is claimed as it falls due.
    claim_ahead_sec: float = 5.0
    claim_ahead_min: int = 5_000
    #: A smaller burst is claimed ahead too, over a shorter horizon: ``burst_ahead_min`` members of a shard due
    #: within ``burst_ahead_sec`` (the same rate, 1,000/s a shard, so a steady stream below it is still claimed as
    #: it falls due, without the owners' lookup). A burst of 10,000 at one instant is 1,250 a shard: claimed at the due
    #: instant, the claim, the owners' lookup and the held record of every member came before the first publish.
    #: The leader looks at its window ``burst_ahead_sec`` before its earliest member is due
    #: (:meth:`FairDispatch.next_look`), so the claim has that long.
    burst_ahead_sec: float = 1.0
    burst_ahead_min: int = 1_000
    #: The first pass of a burst claimed ahead (after a second without work taken) takes at most this many of its
    #: occurrences, and the next pass follows at once: the first executions start after one small dispatch
    #: transaction instead of one of a pool's whole share (10,000 at once: 125 a shard). 0: no head.
    burst_head: int = 16
    #: A PENDING execution dispatched longer ago than this no longer counts against its pool's queue: its
    #: message was lost (the broker restarted, a publish failed) and the sweeper sends it again; counted,
    #: such executions would stop the pool's dispatch until then.
    stale_queue_sec: float = 30.0
    #: A PENDING execution dispatched longer ago than this no longer counts against its pool's rate-following
    #: cap (``pool_queue_sec``; the fixed ``pool_queue_cap`` still counts it): in a queue of half a second of
    #: starts it is stuck, in the partitions of a worker that was killed or stopped until the group moves them
    #: (~5 s), and counting it would leave the pool's live workers with nothing while it sits there (measured:
    #: 4.5-5.2 s without a start in the worker fault tests, against a 3 s bound).
    stuck_queue_sec: float = 1.0
    #: A pool with executions PENDING and none RUNNING for this long has no worker starting its work (none
    #: runs, or none is left): holding its work back would make nothing start sooner, only stop dispatch, so
    #: the pool's queue cap is lifted until something runs there again (see :class:`OpenWork`).
    stalled_pool_sec: float = 3.0
    #: How long the record of the jobs a leader's buffer holds outlives its last pass (renewed every pass):
    #: the hydrator's overdue scan leaves held jobs alone, and recovers them once a dead leader's record expires.
    held_ttl_sec: float = 30.0
    #: How long one dispatcher process reuses its read of the open executions (shared by the shards it leads;
    #: what its passes take meanwhile is counted in at once).
    counts_refresh_sec: float = 0.25
    #: How long one dispatcher process reuses its read of the workers' announced free slots (the first cap of an
    #: unmeasured pool). Workers renew their announcements every 2 s; a read is one Redis round trip.
    slots_refresh_sec: float = 1.0
    #: How long the read of the open executions is reused while a pool with live workers is held at its first cap
    #: (the free slots they announced): the next read, which sees them start that work, lifts the cap to their start
    #: rate. At ``counts_refresh_sec`` a burst of 10,000 due at once on two workers of 256 slots waited up to 0.25 s
    #: after its first 512, its workers idle, before the rest could follow. A read costs one aggregate over the open
    #: executions; this shorter interval applies until a read shows the pool starting work, and again while a pass is
    #: held at a cap below ``pool_queue_cap`` that the pool's workers outpaced (its queue under half of it).
    first_refresh_sec: float = 0.05

    def __post_init__(self) -> None:
        if not 1 <= self.pool_queue_min <= self.pool_queue_cap or self.pool_queue_sec <= 0:
            raise ValueError("pool_queue_min must be in [1, pool_queue_cap] and pool_queue_sec > 0")
        if self.claim_size < 1 or self.buffer_cap < self.claim_size:
            raise ValueError("claim_size must be >= 1 and buffer_cap >= claim_size")
        refreshes = (self.counts_refresh_sec, self.slots_refresh_sec, self.first_refresh_sec)
        if self.stalled_pool_sec <= 0 or min(refreshes) < 0:
            raise ValueError(
                "stalled_pool_sec must be > 0, counts_refresh_sec, slots_refresh_sec and first_refresh_sec >= 0"
            )
        if not 0 < self.retry_queue_share <= 1:
            raise ValueError("retry_queue_share must be within (0, 1]")
        if self.burst_head < 0:
            raise ValueError("burst_head must be >= 0")
