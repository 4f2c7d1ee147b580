"""Dependencies: how long a parent's completion takes to become its children's executions, and what it costs.

    uv run python -m bench dependencies                         # 1,000 children, ports BENCH_PORTS + 60
    uv run python -m bench dependencies --children 5000 --port-offset 1100

It starts its own stack (Postgres, Redis, etcd, the broker, under ``.sundial/bench-deps-<offset>/``), registers
one parent job and ``--children`` DEPENDENT jobs on it, one shard, and then measures, with the real store calls
and the real :class:`~sundial_dispatcher.triggers.TriggerDispatcher`:

* **finish_ms** — the worker's finish of the parent's execution, which now also records one trigger row per
  child in the same statement (the cost a parent with many children adds to the finish path);
* **fan_out_s** — from that commit until every child execution is created (fenced) and published to the
  broker, leader passes back to back (in production they run every 0.1 s beside the dispatch passes);
* **one_child_ms** — P50/P95 over ``--rounds`` of one parent → one child: finish commit → child published
  (the leader's own work; a running dispatcher adds up to its 0.1 s poll). Workers starting the
  executions are the W3 bench's part, not measured here (the fan-out's executions are marked finished
  before the rounds, so the pool's queue cap does not hold the rounds back).

The leader applies fair dispatch's limits (:mod:`sundial_dispatcher.limits`), as a dispatcher does by default;
``--no-limits`` leaves them out (a dispatcher with ``SUNDIAL_DISPATCHER_FAIRNESS=false``).

Results are printed and appended as one JSON line to ``bench/results/<workload>.jsonl`` with the machine. A
benchmark never passes or fails on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from sundial_common.broker.kafka import KafkaPublisher, ensure_topics
from sundial_common.broker.messages import pool_topic
from sundial_common.domain.ids import new_id
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.stores import Stores
from sundial_common.stores.dependencies import Edge
from sundial_common.stores.executions import Outcome
from sundial_common.stores.schema import upgrade
from sundial_dispatcher.fairness import FairnessConfig, OpenWork
from sundial_dispatcher.limits import SideLimits
from sundial_dispatcher.tenancy import TenantPolicy
from sundial_dispatcher.triggers import TriggerConfig, TriggerDispatcher
from sundial_infra.stack import LocalStack

from bench import results
from bench.harness import ports_at
from bench.results import REPO, RESULTS

POOL = "bench-deps"
TENANT = "bench"


def _job(name: str, job_type: str) -> dict[str, Any]:
    return {
        "id": new_id(),
        "tenant_id": TENANT,
        "name": name,
        "type": job_type,
        "pool": POOL,
        "handler": "echo",
        "timeout_sec": 60,
        "state": "ACTIVE",
        "shard": 0,
        "next_fire_at": None,
        "catchup_policy": "FIRE_ONCE",
    }


async def _parent_run(stores: Stores, parent: dict[str, Any]) -> tuple[uuid.UUID, float]:
    """One execution of ``parent``, started and finished by a worker; the finish's seconds."""
    execution_id = new_id()
    await stores.database.pool.execute(
        "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, pool, handler, state,"
        " timeout_sec) VALUES ($1, $2, $3, clock_timestamp(), 0, 1, $4, 'echo', 'PENDING', 60)",
        execution_id,
        TENANT,
        parent["id"],
        POOL,
    )
    await stores.executions.start_executions("bench-worker", [(execution_id, 1)])
    started = time.perf_counter()
    done = await stores.executions.finish_attempts("bench-worker", [Outcome(execution_id, 1, "SUCCEEDED")])
    assert len(done) == 1
    return execution_id, time.perf_counter() - started


async def _drain(leader: TriggerDispatcher, expected: int) -> None:
    fired = 0
    while fired < expected:
        fired += (await leader.run_once()).published


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace, stack: LocalStack) -> dict[str, Any]:
    await upgrade(stack.postgres_dsn)
    ensure_topics(stack.kafka_bootstrap, [pool_topic(POOL)])
    stores = await Stores.connect(stack.postgres_dsn)
    publisher = KafkaPublisher(stack.kafka_bootstrap)
    redis = Redis.from_url(stack.redis_url)
    try:
        token = await stores.dispatch.take_shard(0, "bench")
        limits = (
            None
            if args.no_limits
            else SideLimits(
                TenantPolicy(stores.tenants),
                OpenWork(stores.tenants, FairnessConfig()),
                TokenBuckets(redis),
                shards=1,
                batch_size=1000,
            )
        )
        leader = TriggerDispatcher(
            0,
            token,
            "bench",
            stores.dependencies,
            stores.dispatch,
            publisher,
            TriggerConfig(batch_children=1000),
            limits=limits,
        )
        parent = _job("parent", "INTERVAL")
        parent.update(interval_sec=3600, start_at=datetime.now(UTC))
        await stores.jobs.insert_job(parent, actor="bench")
        for i in range(args.children):
            await stores.dependencies.create_dependent_job(
                _job(f"child-{i}", "DEPENDENT"), [Edge(parent["id"])], actor="bench"
            )

        _, finish_sec = await _parent_run(stores, parent)
        started = time.perf_counter()
        await _drain(leader, args.children)
        fan_out_sec = time.perf_counter() - started
        # The workers' part: the children ran (their open executions would hold the pool's queue full).
        await stores.database.pool.execute("UPDATE executions SET state = 'SUCCEEDED' WHERE state = 'PENDING'")

        single = _job("single", "INTERVAL")
        single.update(interval_sec=3600, start_at=datetime.now(UTC))
        await stores.jobs.insert_job(single, actor="bench")
        await stores.dependencies.create_dependent_job(
            _job("single-child", "DEPENDENT"), [Edge(single["id"])], actor="bench"
        )
        one_child: list[float] = []
        for _ in range(args.rounds):
            await _parent_run(stores, single)
            started = time.perf_counter()
            await _drain(leader, 1)
            one_child.append((time.perf_counter() - started) * 1000)
            # A worker's part: the child ran (unstarted, 4 of them fill a pool's rate-following queue cap and
            # the next child waits for the stalled-pool rule: what the limits are for, not the leader's cost).
            await stores.database.pool.execute("UPDATE executions SET state = 'SUCCEEDED' WHERE state = 'PENDING'")
    finally:
        await redis.aclose()
        await publisher.close()
        await stores.close()
    return {
        "finish_ms": round(finish_sec * 1000, 1),
        "fan_out_s": round(fan_out_sec, 3),
        "fan_out_per_s": round(args.children / fan_out_sec),
        "one_child_ms": {"p50": round(_percentile(one_child, 0.5), 1), "p95": round(_percentile(one_child, 0.95), 1)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench dependencies", description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--port-offset", type=int, default=60, help="ports = BENCH_PORTS + this")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the <workload>.jsonl files")
    parser.add_argument("--no-limits", action="store_true", help="without fair dispatch's limits (fairness off)")
    args = parser.parse_args(argv)
    os.environ.setdefault("SUNDIAL_ENV", "dev")  # the stack's development signing key
    stack = LocalStack(REPO / ".sundial" / f"bench-deps-{args.port_offset}", ports_at(args.port_offset), durable=False)
    stack.stop()  # leftovers of an interrupted run
    stack.start()
    try:
        line = asyncio.run(run(args, stack))
    finally:
        stack.stop()
    settings = {"children": args.children, "rounds": args.rounds, "limits": not args.no_limits}
    results.record("dependencies", line, settings, results=args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
