"""Helpers for the high-availability tests and the failover bench: dispatcher replicas as real processes.

``HaCluster`` starts ``sundial dispatcher`` / ``hydrator`` / ``sweeper`` processes through the e2e
``Processes`` harness with short leases (TTL 2 s), puts jobs due at chosen instants straight into a
chosen shard (Postgres + hot window, as the API does), and checks the invariants the fault suite checks:
every job has exactly one execution, and no write carries a token older than one already written for
its shard.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, overload

import aetcd
import asyncpg
import pytest
from redis.asyncio import Redis
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_common.coordination.registry import ClusterKeys
from sundial_common.domain.ids import new_id, shard_for
from sundial_common.hotwindow.window import HotWindow
from sundial_common.hotwindow.worker_announcements import WorkerAnnouncement, WorkerAnnouncements
from sundial_common.stores import Stores
from sundial_common.stores.types import Occurrence

from tests.support.processes import Processes

T = TypeVar("T")

LEASE_TTL = 2.0
LEASE_MARGIN = 0.5
ORPHAN_GRACE = 0.5


def ms(instant: datetime) -> datetime:
    """Fire times are stored at millisecond precision, as the API writes them."""
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` = stopped by a signal), or ``?`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]], within: float, what: str, interval: float = 0.05
) -> T: ...


@overload
async def eventually(check: Callable[[], T | None], within: float, what: str, interval: float = 0.05) -> T: ...


async def eventually(check: Callable[[], object], within: float, what: str, interval: float = 0.05) -> object:
    """Await/poll ``check`` until it returns something truthy, and return that; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within}s (last: {value!r})")
        await asyncio.sleep(interval)


@dataclass(frozen=True)
class Gap:
    """The longest time a shard went without a dispatch, and around which instant."""

    shard: int
    seconds: float
    after: datetime


class HaCluster:
    def __init__(
        self,
        processes: Processes,
        *,
        database_url: str,
        redis_url: str,
        etcd_endpoint: str,
        kafka_bootstrap: str,
        shards: int,
        pool: str | None = None,
    ) -> None:
        self.processes = processes
        self.database_url = database_url
        self.redis_url = redis_url
        self.etcd_endpoint = etcd_endpoint
        self.shards = shards
        self.pool = pool or f"ha-{uuid.uuid4().hex[:8]}"
        ensure_topics(kafka_bootstrap, [pool_topic(self.pool)])
        self.env = {
            "SUNDIAL_SHARDS": str(shards),
            "SUNDIAL_LEASE_TTL_SEC": str(LEASE_TTL),
            "SUNDIAL_LEASE_MARGIN_SEC": str(LEASE_MARGIN),
            "SUNDIAL_DISPATCHER_ORPHAN_GRACE_SEC": str(ORPHAN_GRACE),
            # Occurrences claimed by a leader that died (or was fenced) before committing come back fast.
            "SUNDIAL_HYDRATOR_OVERDUE_GRACE_SEC": "1",
            "SUNDIAL_HYDRATOR_OVERDUE_INTERVAL_SEC": "1",
            "SUNDIAL_HYDRATOR_INTERVAL_SEC": "0.5",
        }
        self.keys = ClusterKeys()
        self.dispatchers: set[str] = set()

    # -- processes ---------------------------------------------------------------------------------

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        return self.processes.start(name, *args, env={**self.env, "SUNDIAL_INSTANCE_ID": name, **env})

    def start_dispatcher(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        self.dispatchers.add(name)
        return self.start(name, "dispatcher", **env)

    def pid(self, name: str) -> int:
        return self.processes.running[name].pid

    def kill(self, name: str) -> None:
        """kill -9: no resign, no revoke; etcd expires the leases."""
        proc = self.processes.running.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def terminate(self, name: str, timeout: float = 20.0) -> int:
        return self.processes.stop(name, signal.SIGTERM, timeout)

    def pause(self, name: str) -> None:
        os.kill(self.pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.pid(name), signal.SIGCONT)

    def resume_all(self) -> None:
        for proc in self.processes.running.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)

    # -- etcd --------------------------------------------------------------------------------------

    def etcd(self) -> aetcd.Client:
        host, port = self.etcd_endpoint.rsplit(":", 1)
        return aetcd.Client(host=host, port=int(port))

    async def leaders(self) -> dict[int, tuple[str, int]]:
        """shard -> (holder, revision of its leader key) for every shard that has a leader now (the fencing
        token is in Postgres: ``shard_fence``)."""
        async with self.etcd() as etcd:
            found = await etcd.get_prefix(self.keys.shard_prefix.encode())
        leaders = {}
        for kv in found:
            shard, _, what = kv.key.decode()[len(self.keys.shard_prefix) :].partition("/")
            if what == "leader":
                leaders[int(shard)] = (kv.value.decode(), int(kv.create_revision))
        return leaders

    async def wait_for_leaders(self, expected: Callable[[dict[int, tuple[str, int]]], bool], within: float) -> Any:
        """Wait ``within`` seconds for ``expected`` leaders, counted from when every running dispatcher has started:
        starting a Python process takes seconds on a loaded machine, and it is the election that is timed."""
        for name in self.dispatchers & self.processes.running.keys():
            if process_state(self.pid(name)) not in ("T", "?"):
                await asyncio.to_thread(self.processes.wait_for_log, name, f"dispatcher {name} started", 60)

        async def check() -> dict[int, tuple[str, int]] | None:
            leaders = await self.leaders()
            return leaders if expected(leaders) else None

        return await eventually(check, within, "expected shard leaders")

    # -- jobs --------------------------------------------------------------------------------------

    async def add_jobs(self, due: Sequence[datetime], shard: int | None = None) -> list[uuid.UUID]:
        """One ONE_SHOT job per instant, in ``shard`` (or wherever its id hashes), in Postgres and Redis."""
        stores = await Stores.connect(self.database_url, max_size=8)
        redis = Redis.from_url(self.redis_url)
        window = HotWindow(redis)
        ids: list[uuid.UUID] = []
        by_shard: dict[int, list[Occurrence]] = defaultdict(list)
        limit = asyncio.Semaphore(8)

        async def insert(instant: datetime) -> None:
            job_id = new_id()
            while shard is not None and shard_for(job_id, self.shards) != shard:
                job_id = new_id()
            job_shard = shard_for(job_id, self.shards)
            async with limit:
                await stores.jobs.insert_job(
                    {
                        "id": job_id,
                        "tenant_id": "ha",
                        "name": "ha",
                        "type": "ONE_SHOT",
                        "run_at": ms(instant),
                        "pool": self.pool,
                        "handler": "echo",
                        "payload": {},
                        "timeout_sec": 30,
                        "shard": job_shard,
                        "next_fire_at": ms(instant),
                    },
                    actor="ha-test",
                )
            ids.append(job_id)
            by_shard[job_shard].append(Occurrence(job_id, ms(instant)))

        try:
            await asyncio.gather(*(insert(instant) for instant in due))
            for job_shard, occurrences in by_shard.items():
                await window.add(job_shard, occurrences)
        finally:
            await redis.aclose()
            await stores.close()
        return ids

    async def announce_consumer(self) -> None:
        """Announce a consumer of 1,000 free slots in the cluster's pool, as a large worker would: no worker reads
        it, and without one the dispatcher caps the pool's unmeasured queue small (its work would wait for the
        stalled-pool rule, 3 s). The priority tests cover that cap; here what a failover costs dispatch is measured.
        """
        consumer = WorkerAnnouncement(
            worker_id="ha-consumer",
            pool=self.pool,
            handlers=("echo",),
            concurrency=1000,
            free_slots=1000,
            version="test",
            host="127.0.0.1",
            pid=os.getpid(),
            started_at=datetime.now(UTC),
        )
        redis = Redis.from_url(self.redis_url)
        try:
            await WorkerAnnouncements(redis).announce(consumer, ttl_sec=900)
        finally:
            await redis.aclose()

    async def add_timeline(
        self, period: float, count: int, *, shard: int | None = None, inserts_per_sec: float = 250.0
    ) -> tuple[datetime, list[uuid.UUID]]:
        """``count`` jobs due ``period`` s apart from a start far enough ahead to insert them all first (at
        ``inserts_per_sec``, slow for this machine); the start and the ids. A timeline that began while its jobs
        were still being inserted would measure the insert, not the dispatchers: that fails, naming the insert."""
        lead = 1.0 + count / inserts_per_sec
        start = datetime.now(UTC) + timedelta(seconds=lead)
        began = time.monotonic()
        jobs = await self.add_jobs(every(start, period, count), shard=shard)
        took = time.monotonic() - began
        assert datetime.now(UTC) < start, f"inserting {count} jobs took {took:.1f}s, past their {lead:.1f}s lead"
        return start, jobs

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.database_url)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    async def dispatched(self) -> int:
        rows = await self.fetch("SELECT count(*) AS n FROM executions")
        return int(rows[0]["n"])

    async def wait_all_dispatched(self, jobs: int, within: float) -> None:
        async def done() -> bool:
            return await self.dispatched() >= jobs

        await eventually(done, within, f"all {jobs} jobs dispatched", interval=0.2)

    async def dispatch_gaps(self, since: datetime | None = None) -> dict[int, Gap]:
        """Per shard, the longest interval between two consecutive dispatch transactions."""
        rows = await self.fetch(
            "SELECT DISTINCT shard, created_at FROM executions WHERE $1::timestamptz IS NULL OR created_at >= $1 "
            "ORDER BY shard, created_at",
            since,
        )
        gaps: dict[int, Gap] = {}
        previous: dict[int, datetime] = {}
        for row in rows:
            shard, at = row["shard"], row["created_at"]
            if shard in previous:
                seconds = (at - previous[shard]).total_seconds()
                if shard not in gaps or seconds > gaps[shard].seconds:
                    gaps[shard] = Gap(shard, seconds, previous[shard])
            previous[shard] = at
        return gaps

    async def dispatch_lateness(self, since: datetime) -> dict[int, float]:
        """Per shard, the longest a job due from ``since`` waited past its due instant for its dispatch transaction
        (negative: every one was dispatched ahead, SUNDIAL_DISPATCHER_PUBLISH_LEAD_MS)."""
        rows = await self.fetch(
            "SELECT shard, extract(epoch FROM max(created_at - scheduled_for))::float8 AS late FROM executions "
            "WHERE scheduled_for >= $1 GROUP BY shard",
            since,
        )
        return {row["shard"]: row["late"] for row in rows}

    async def check_invariants(self, job_ids: Sequence[uuid.UUID]) -> dict[str, int]:
        """Nothing lost, nothing doubled, no stale-token write. Returns counts for the report."""
        executions = await self.fetch("SELECT job_id, scheduled_for, shard, fence_token FROM executions")
        per_job: dict[uuid.UUID, int] = defaultdict(int)
        for row in executions:
            per_job[row["job_id"]] += 1
        missing = [j for j in job_ids if per_job.get(j, 0) == 0]
        doubled = {j: n for j, n in per_job.items() if n > 1}
        assert not missing, f"{len(missing)} jobs never dispatched, e.g. {missing[:3]}"
        assert not doubled, f"jobs with more than one execution: {list(doubled.items())[:3]}"
        assert len(executions) == len(job_ids), f"{len(executions)} executions for {len(job_ids)} jobs"

        # Dispatch transactions of one shard serialize on its shard_fence row (raise_fence runs first and
        # holds the row lock until commit), and their audit rows take identity values while holding it. So
        # in audit-id order a shard's writes must carry non-decreasing tokens: a lower token after a higher
        # one would be a stale leader's write that the fence failed to stop.
        ordered = await self.fetch(
            "SELECT e.shard, e.fence_token, a.id FROM executions e "
            "JOIN audit_log a ON a.entity_id = e.id AND a.entity = 'execution' AND a.action = 'dispatch' "
            "ORDER BY a.id"
        )
        highest: dict[int, int] = {}
        for row in ordered:
            shard, token = row["shard"], row["fence_token"]
            assert token >= highest.get(shard, 0), f"shard {shard}: token {token} written after {highest[shard]}"
            highest[shard] = token
        recorded = {row["shard"]: row["token"] for row in await self.fetch("SELECT shard, token FROM shard_fence")}
        for shard, token in highest.items():
            assert recorded[shard] >= token
        return {"executions": len(executions), "terms": len({(r["shard"], r["fence_token"]) for r in executions})}


def every(start: datetime, period: float, count: int) -> list[datetime]:
    """``count`` instants ``period`` seconds apart from ``start``."""
    return [start + timedelta(seconds=i * period) for i in range(count)]


@pytest.fixture(name="cluster")
async def cluster_fixture(
    settings_env: dict[str, str],
    tmp_path: Path,
    database_url: str,
    redis_url: str,
    etcd_endpoint: str,
    kafka_bootstrap: str,
) -> AsyncIterator[HaCluster]:
    """An ``HaCluster`` with 8 shards; every process it started is stopped afterwards (paused ones resumed first)."""
    processes = Processes(settings_env, tmp_path)
    ha = HaCluster(
        processes,
        database_url=database_url,
        redis_url=redis_url,
        etcd_endpoint=etcd_endpoint,
        kafka_bootstrap=kafka_bootstrap,
        shards=8,
    )
    try:
        await ha.announce_consumer()
        yield ha
    finally:
        ha.resume_all()  # a SIGSTOPped process cannot act on SIGTERM
        processes.stop_all()
