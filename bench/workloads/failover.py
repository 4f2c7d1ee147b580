"""Failover benchmark: how long a shard goes without dispatching when its leader dies or stops.

    uv run python -m bench failover                     # 10 kill -9 trials + 10 SIGTERM trials, TTL 5 s
    uv run python -m bench failover --trials 20 --ttl 2

It starts its own stack (Postgres, Redis, etcd, broker on ``BENCH_PORTS + 20``, under
``.sundial/bench-failover/``), a hydrator and ``--replicas`` dispatcher replicas sharing ``--shards``
shards, with the production lease settings unless told otherwise. A feeder keeps one job due every
``--period`` seconds (100 ms) on shard 0. Each trial waits for a calm cluster, then kills shard 0's
leader (``kill -9``: nothing is revoked, etcd must expire the lease) or stops it (SIGTERM: it finishes
its pass and revokes the lease), and reads from Postgres:

* **dispatch gap** — time between the last dispatch transaction of the old term on shard 0 and the
  first of the new one. With a job every 100 ms an undisturbed shard shows gaps of ~0.1 s; the outage
  is roughly the gap minus one period.
* **failover** — time from the signal to the new term's first dispatch.

Then the victim is restarted (a new replica id, as a new pod would have) and the cluster allowed to
settle (the restarted replica may pull shard 0 back with a graceful handover, which is not measured).
Results are printed and appended as one JSON line to ``bench/results/<workload>.jsonl``. A benchmark never
passes or fails on timing: the targets (crash ≤ TTL + 1 s, graceful ≤ 0.5 s) are for the reader.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aetcd
import asyncpg
from redis.asyncio import Redis
from sundial_common.broker.kafka import ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_common.coordination.registry import ClusterKeys
from sundial_common.domain.ids import new_id, shard_for
from sundial_common.hotwindow.window import HotWindow
from sundial_common.stores import Stores
from sundial_common.stores.types import Occurrence
from sundial_infra.stack import BENCH_PORTS, LocalStack, Ports

from bench import results
from bench.results import REPO, RESULTS

SUNDIAL = str(Path(sys.executable).with_name("sundial"))
POOL = "bench-failover"
SHARD = 0


def percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        # Nearest-rank: with 10 samples P99 is the largest one, as it should be.
        return round(ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))], 3)

    return {"p50": round(statistics.median(ordered), 3), "p99": at(0.99), "max": round(ordered[-1], 3)}


@dataclass
class Trial:
    kind: str  # "kill" or "term"
    victim: str
    old_token: int
    new_token: int
    new_leader: str
    gap_sec: float
    failover_sec: float


class FailoverBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        ports = Ports(**{f.name: getattr(BENCH_PORTS, f.name) + args.port_offset for f in dataclasses.fields(Ports)})
        self.root = REPO / ".sundial" / "bench-failover"
        self.stack = LocalStack(self.root, ports, durable=False)
        self.logs = self.root / "logs"
        self.env = {
            **os.environ,
            **self.stack.env(),
            "PYTHONUNBUFFERED": "1",
            "SUNDIAL_SHARDS": str(args.shards),
            "SUNDIAL_LEASE_TTL_SEC": str(args.ttl),
            "SUNDIAL_LEASE_MARGIN_SEC": str(args.margin),
            "SUNDIAL_HYDRATOR_OVERDUE_GRACE_SEC": "1",
            "SUNDIAL_HYDRATOR_OVERDUE_INTERVAL_SEC": "1",
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.serial = 0
        self.keys = ClusterKeys()

    # -- processes ---------------------------------------------------------------------------------

    def spawn(self, name: str, *args: str) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [SUNDIAL, *args],
            env={**self.env, "SUNDIAL_INSTANCE_ID": name},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def new_dispatcher(self) -> str:
        self.serial += 1
        name = f"dispatcher-{self.serial}"
        self.spawn(name, "dispatcher")
        return name

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()

    # -- etcd and Postgres -------------------------------------------------------------------------

    async def leader(self, etcd: aetcd.Client, db: asyncpg.Connection) -> tuple[str, int] | None:
        """Shard 0's leader and its fencing token (issued by Postgres when its term took the shard), or None
        while it has no leader or its leader has not taken it yet."""
        found = await etcd.get(f"{self.keys.shard_prefix}{SHARD}/leader".encode())
        if found is None:
            return None
        holder = found.value.decode()
        token = await db.fetchval("SELECT token FROM shard_fence WHERE shard = $1 AND holder = $2", SHARD, holder)
        return None if token is None else (holder, int(token))

    async def calm(self, etcd: aetcd.Client, db: asyncpg.Connection, quiet_sec: float) -> tuple[str, int]:
        """Wait until every replica is registered (a restarted one has finished starting), every shard has a
        leader, no handover is pending, and shard 0's leader has not changed for ``quiet_sec`` and has
        dispatched meanwhile."""
        stable_since, seen = time.monotonic(), None
        while True:
            keys = await etcd.get_prefix(self.keys.shard_prefix.encode())
            leaders = sum(1 for kv in keys if kv.key.endswith(b"/leader"))
            pending = any(kv.key.endswith(b"/successor") for kv in keys)
            prefix = self.keys.replicas("dispatcher")
            registered = {kv.key[len(prefix) :].decode() for kv in await etcd.get_prefix(prefix)}
            alive = {n for n, proc in self.procs.items() if n.startswith("dispatcher-") and proc.poll() is None}
            current = await self.leader(etcd, db)
            if current != seen or leaders < self.args.shards or pending or not alive <= registered:
                seen, stable_since = current, time.monotonic()
            elif current is not None and time.monotonic() - stable_since >= quiet_sec:
                recent = await db.fetchval(
                    "SELECT count(*) FROM executions WHERE shard = $1 AND fence_token = $2 "
                    "AND created_at > now() - make_interval(secs => $3)",
                    SHARD,
                    current[1],
                    quiet_sec,
                )
                if recent:
                    return current
            await asyncio.sleep(0.05)

    # -- the job feed ------------------------------------------------------------------------------

    async def feed(self, stop: asyncio.Event) -> None:
        """Keep jobs due every ``period`` on shard 0, inserted a few seconds ahead of time."""
        stores = await Stores.connect(self.stack.postgres_dsn, max_size=2)
        redis = Redis.from_url(self.stack.redis_url)
        window = HotWindow(redis)
        period = timedelta(seconds=self.args.period)
        next_due = datetime.now(UTC) + timedelta(seconds=1)
        next_due = next_due.replace(microsecond=next_due.microsecond // 1000 * 1000)
        try:
            while not stop.is_set():
                horizon = datetime.now(UTC) + timedelta(seconds=5)
                batch = []
                while next_due < horizon:
                    job_id = new_id()
                    while shard_for(job_id, self.args.shards) != SHARD:
                        job_id = new_id()
                    await stores.jobs.insert_job(
                        {
                            "id": job_id,
                            "tenant_id": "bench",
                            "name": "failover",
                            "type": "ONE_SHOT",
                            "run_at": next_due,
                            "pool": POOL,
                            "handler": "noop",
                            "payload": {},
                            "timeout_sec": 30,
                            "shard": SHARD,
                            "next_fire_at": next_due,
                        },
                        actor="bench",
                    )
                    batch.append(Occurrence(job_id, next_due))
                    next_due += period
                await window.add(SHARD, batch)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            await redis.aclose()
            await stores.close()

    # -- one trial ---------------------------------------------------------------------------------

    async def trial(self, kind: str, etcd: aetcd.Client, db: asyncpg.Connection) -> Trial:
        victim, old_token = await self.calm(etcd, db, quiet_sec=1.0)
        proc = self.procs.pop(victim)
        signalled = datetime.now(UTC)
        proc.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        deadline = time.monotonic() + self.args.ttl * 3 + 10
        while True:
            row = await db.fetchrow(
                "SELECT fence_token, min(created_at) AS first FROM executions WHERE shard = $1 AND fence_token > $2 "
                "GROUP BY fence_token ORDER BY fence_token LIMIT 1",
                SHARD,
                old_token,
            )
            if row is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no new leader dispatched shard {SHARD} within {deadline}s of the {kind}")
            await asyncio.sleep(0.02)
        last_old = await db.fetchval(
            "SELECT max(created_at) FROM executions WHERE shard = $1 AND fence_token = $2", SHARD, old_token
        )
        proc.wait(30)
        new_leader = await db.fetchval("SELECT holder FROM shard_fence WHERE shard = $1", SHARD)
        self.new_dispatcher()  # the victim comes back as a new replica
        return Trial(
            kind=kind,
            victim=victim,
            old_token=old_token,
            new_token=int(row["fence_token"]),
            new_leader=str(new_leader),
            gap_sec=round((row["first"] - last_old).total_seconds(), 3),
            failover_sec=round((row["first"] - signalled).total_seconds(), 3),
        )

    # -- the whole run -----------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        ensure_topics(self.stack.kafka_bootstrap, [pool_topic(POOL)])
        self.spawn("hydrator", "hydrator")
        for _ in range(self.args.replicas):
            self.new_dispatcher()
        stop = asyncio.Event()
        feeder = asyncio.create_task(self.feed(stop), name="bench-feed")
        host, port = self.stack.etcd_endpoint.rsplit(":", 1)
        trials: list[Trial] = []
        try:
            async with aetcd.Client(host=host, port=int(port)) as etcd:
                db = await asyncpg.connect(self.stack.postgres_dsn)
                try:
                    for kind, count in (("kill", self.args.trials), ("term", self.args.graceful_trials)):
                        for i in range(count):
                            trial = await self.trial(kind, etcd, db)
                            trials.append(trial)
                            print(
                                f"{kind:4} #{i + 1:2}: {trial.victim} -> {trial.new_leader}: "
                                f"gap {trial.gap_sec:.3f}s, failover {trial.failover_sec:.3f}s",
                                flush=True,
                            )
                    periods = await db.fetch(
                        "SELECT extract(epoch FROM created_at - lag(created_at) OVER (ORDER BY created_at)) AS d "
                        "FROM (SELECT DISTINCT created_at FROM executions WHERE shard = $1) t",
                        SHARD,
                    )
                finally:
                    await db.close()
        finally:
            stop.set()
            await feeder
        undisturbed = sorted(float(r["d"]) for r in periods if r["d"] is not None)
        summary: dict[str, Any] = {
            "median_gap_between_dispatches_sec": round(statistics.median(undisturbed), 3) if undisturbed else None,
        }
        for kind in ("kill", "term"):
            chosen = [t for t in trials if t.kind == kind]
            if chosen:
                summary[kind] = {
                    "trials": len(chosen),
                    "dispatch_gap_sec": percentiles([t.gap_sec for t in chosen]),
                    "failover_sec": percentiles([t.failover_sec for t in chosen]),
                }
        summary["trials"] = [dataclasses.asdict(t) for t in trials]
        return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="kill -9 trials (default 10)")
    parser.add_argument("--graceful-trials", type=int, default=10, help="SIGTERM trials (default 10)")
    parser.add_argument("--replicas", type=int, default=2, help="dispatcher replicas (default 2)")
    parser.add_argument("--shards", type=int, default=8, help="shards (default 8)")
    parser.add_argument("--ttl", type=float, default=5.0, help="lease TTL, seconds (default 5, as in production)")
    parser.add_argument("--margin", type=float, default=1.0, help="trust-window margin in seconds (default 1)")
    parser.add_argument("--period", type=float, default=0.1, help="seconds between jobs on shard 0 (default 0.1)")
    parser.add_argument("--port-offset", type=int, default=20, help="ports = BENCH_PORTS + this")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the <workload>.jsonl files")
    args = parser.parse_args(argv)
    if args.replicas < 2:
        parser.error("--replicas must be at least 2: someone has to take over")

    bench = FailoverBench(args)
    bench.stack.stop()  # leftovers of an interrupted run
    shutil.rmtree(bench.root, ignore_errors=True)
    bench.logs.mkdir(parents=True)
    print(f"starting the stack under {bench.root} …", flush=True)
    bench.stack.start()
    try:
        migrated = subprocess.run([SUNDIAL, "migrate"], env=bench.env, capture_output=True, text=True)
        if migrated.returncode != 0:
            print(migrated.stderr, file=sys.stderr)
            return 1
        summary = asyncio.run(bench.run())
    finally:
        bench.stop_all()
        bench.stack.stop()
    settings = {
        "replicas": args.replicas,
        "shards": args.shards,
        "lease_ttl_sec": args.ttl,
        "lease_margin_sec": args.margin,
        "job_period_sec": args.period,
    }
    results.record("failover", summary, settings, results=args.results)
    print(f"logs in {bench.logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
