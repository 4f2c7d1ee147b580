"""Weighted fair dispatch: which due occurrences a shard's pass takes, across tenants, pools and quotas.

Five modules: :mod:`.config` (the knobs), :mod:`.queues` (the buffer: per-tenant priority queues served by deficit
round robin, and what was claimed ahead), :mod:`.pool_room` (how much each pool and tenant may take, from the open
executions), :mod:`.registry` (whether every registered pool has a room of its own) and :mod:`.dispatch` (one shard
leader's claims into the buffer and each pass's share).

Without it a pass takes the earliest members of the hot window: tenant A's 50,000 jobs due at midnight are
all taken (and published) before tenant B's 100 due at the same instant, and B waits for A's whole burst.
Two mechanisms make B wait for nobody:

**A per-tenant buffer, served by deficit round robin.** Each pass claims due members from the hot window
into the leader's buffer (up to ``claim_size`` a pass, ``buffer_cap`` held), learns whose each job is (one
primary-key query), and queues it in its tenant's FIFO. The pass then takes up to ``batch_size`` occurrences
round-robin over the tenants with work, each round giving a tenant ``weight`` more turns (DRR): under
contention each tenant gets dispatch in proportion to its weight, and a tenant with little work is served at
once. Within a tenant, priority orders the work (``HIGH``, then ``NORMAL``, then ``LOW``, each in due order, one
take in ten to the oldest whatever its priority: :class:`TenantQueue`); never across tenants.

**A burst is claimed before it is due.** Claiming and looking up tens of thousands of members takes passes
of a second or more; paid at the burst's due instant, that is lateness for every tenant in it. So when at
least ``claim_ahead_min`` members of the shard fall due within ``claim_ahead_sec``, the pass claims them
early (one Redis script counts and claims), looks up whose they are, and keeps them by due time in
``early``; each pass moves those now due into the round robin. Retries are never taken early.

**Short pool queues.** A Kafka topic is first in, first out: what is published behind a backlog waits for
it, whatever the dispatcher does later. So a pass publishes to a pool only while fewer of its executions are
PENDING (published, not started) than the pool's cap, about ``pool_queue_sec`` of its workers' starts
(:class:`OpenWork`): the backlog waits here, where the round robin can still put B's work first and a
tenant's ``HIGH`` work ahead of its ``LOW``, rather than in the topic. The same count per tenant enforces
``maxConcurrentExecutions`` (beyond it the tenant's work waits, late but never lost), and a Redis token
bucket per tenant (shared by every shard leader) ``maxDispatchPerSec``. A pool where nothing runs at all
(no worker) is not held back: that would stop dispatch without making anything start sooner
(:class:`OpenWork`).

**Cost.** The counts are one aggregate over the open executions, read by each dispatcher process at most
every ``counts_refresh_sec`` and shared by the shards it leads; whose each claimed job is (one primary-key
query) is looked up only when the pass cannot send everything it claimed at once (a backlog, a quota), or sends
more than a burst head while some registered pool has no room of its own (:mod:`.registry`).

Members in the buffer are out of Redis but not dispatched: a term that ends puts them back
(:meth:`FairDispatch.release`), a pass whose reads fail puts back what it claimed and had not buffered yet
(as the dispatch pass does after a failed commit); if the leader dies instead, the jobs are still due in
Postgres and the hydrator's overdue scan puts them back (nothing accepted is lost), as for any claimed member. While
a live leader holds them, a Redis set per shard (renewed every second, expiring ``held_ttl_sec`` after the last)
tells the overdue scan they are not lost: re-adding a burst's held jobs would refill the hot window ahead of
other tenants' members (measured: 20,000 re-added every 10 s, B's jobs 85 s late behind A's 100,000).

**Scheduled retries wait their turn too.** A retry claimed from the hot window queues in its tenant's queue like a
job's occurrence (whose it is: one primary-key query on the executions), under the same pool room and quotas, and
is held in the same record. Passed straight through ahead of the queue, a bulk re-drive of 100,000 DEAD executions
at 500/s filled the shared pool's topic, and another tenant's jobs waited behind it (P95 lateness 0.4-1.3 s).
Only their commit differs: the retry pass's fenced compare-and-swap behind the breaker's gate. Retries waiting for
their share of a pool's room do not make a pass contended for the first fires it claims: those go out as they would
without them (ahead, within the publish lead), so the other jobs of a re-drive's shard are not sent late.
"""

from __future__ import annotations

from sundial_dispatcher.fairness.config import FairnessConfig
from sundial_dispatcher.fairness.dispatch import FairDispatch
from sundial_dispatcher.fairness.pool_room import OpenWork
from sundial_dispatcher.fairness.queues import NOBODY, PRIORITIES, Arrival, EarlyWork, FairQueue, TenantQueue, Waiting

__all__ = [
    "NOBODY",
    "PRIORITIES",
    "Arrival",
    "EarlyWork",
    "FairDispatch",
    "FairQueue",
    "FairnessConfig",
    "OpenWork",
    "TenantQueue",
    "Waiting",
]
