"""Reliable execution under fire: faults injected into a running stack, each with the same promises.

Each scenario starts every Sundial process (supervised: a killed one comes back, as under ``make up``),
creates ``1,000 × SUNDIAL_FAULT_SCALE`` jobs through HTTP, injects its fault while they run, lets the
system heal, and checks Postgres (``FaultStack.check``): no acknowledged create lost; every due job reached a
terminal state; at most one accepted completion per (job, occurrence); no write committed with a stale
fencing token. Duplicate handler starts are allowed (at-least-once) and reported.

1. the dispatcher killed at each crash point   3. Postgres stopped (immediate) during create load
2. Redis FLUSHALL, then Redis restarted empty  4. a retry storm: every handler fails for a while

The broker restarting empty is in ``test_dispatch_recovery.py`` (noticed and republished at once); a worker's
faults (killed and restarted, killed for good, SIGSTOPped) are in ``test_worker_faults.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sundial_infra.stack import LocalStack

from tests.faults.harness import FaultStack, budget, one_shots, scaled
from tests.support.ha import eventually

JOBS = scaled(1000)
pytestmark = [pytest.mark.faults, pytest.mark.timeout(int(budget(300)))]


@pytest.fixture
async def faults(settings_env: dict[str, str], tmp_path: Path) -> AsyncIterator[FaultStack]:
    stack = FaultStack(settings_env, tmp_path)
    stack.start()
    try:
        await stack.ready()
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


def report(name: str, line: str) -> None:
    print(f"\nfault {name}: {line}")


async def test_the_dispatcher_killed_at_each_crash_point_loses_and_doubles_nothing(faults: FaultStack) -> None:
    bodies = one_shots(faults.pool, JOBS, start_in=4, spread=10, payload={"ms": 20})
    creating = asyncio.create_task(faults.create_jobs(bodies))
    # A second replica armed with a crash point takes its share of the shards, dies at its first pass with
    # due work, and is not restarted (the supervised replica takes its shards back); then the other point.
    for point in ("dispatcher.after_claim", "dispatcher.after_commit"):
        name = f"crash-{point.split('.')[1]}"
        proc = faults.extra.start(name, "dispatcher", env={"SUNDIAL_CRASH_POINT": point, "SUNDIAL_INSTANCE_ID": name})

        def crashed(p: subprocess.Popen[bytes] = proc) -> bool:
            return p.poll() is not None

        await eventually(crashed, 60, f"{name} to reach {point}")
        assert proc.returncode == 137 and f"crash point {point} reached" in faults.log(name), faults.log(name)[-2000:]
    job_ids = await creating
    await faults.wait_terminal(len(job_ids), within=120)
    result = await faults.check(job_ids)
    republished = faults.log("sweeper").count("republished")
    report("dispatcher crash points", f"{result.line()}; {republished} sweeper passes republished the outbox")


async def test_redis_flushed_then_restarted_empty_loses_nothing(faults: FaultStack, stack: LocalStack) -> None:
    from redis.asyncio import Redis

    bodies = one_shots(faults.pool, JOBS, start_in=4, spread=10, payload={"ms": 300})
    creating = asyncio.create_task(faults.create_jobs(bodies))

    async def some_done() -> bool:
        return await faults.terminal() >= JOBS // 5

    await eventually(some_done, budget(180), "a fifth of the jobs done")
    redis = Redis.from_url(stack.redis_url)
    try:
        await redis.flushall()  # hot windows, watermarks, heartbeats, cancel flags: all gone
    finally:
        await redis.aclose()

    async def half_done() -> bool:
        return await faults.terminal() >= JOBS // 2

    await eventually(half_done, budget(180), "half of the jobs done")
    await asyncio.to_thread(stack.redis.restart)  # not durable: it comes back empty
    job_ids = await creating
    await faults.wait_terminal(len(job_ids), within=120)
    result = await faults.check(job_ids)
    # Heartbeats vanished with Redis, but their workers were alive: the sweeper waited for them to come back.
    assert result.attempt_states["FAILED_WORKER_LOST"] == 0, result.line()
    assert "rebuil" in faults.log("hydrator") or "re-added" in faults.log("hydrator")
    report("redis flush + restart", result.line())


async def test_postgres_restarted_during_create_load_makes_one_job_per_key(
    faults: FaultStack, stack: LocalStack
) -> None:
    bodies = one_shots(faults.pool, JOBS, start_in=8, spread=4, payload={"ms": 20})
    creating = asyncio.create_task(faults.create_jobs(bodies, concurrency=16, within=180))

    async def creates_under_way() -> bool:
        return sum(faults.create_attempts.values()) >= JOBS // 3 if hasattr(faults, "create_attempts") else False

    await eventually(creates_under_way, budget(180), "a third of the creates sent")
    await asyncio.to_thread(stack.postgres.stop, "immediate")  # pg_ctl stop -m immediate: a crash
    await asyncio.sleep(1.0)  # the outage itself: creates meanwhile get 503 and are retried with their key
    await asyncio.to_thread(stack.postgres.start)
    job_ids = await creating
    await faults.wait_terminal(len(job_ids), within=150)
    result = await faults.check(job_ids)
    failed_creates = {k: v for k, v in faults.create_attempts.items() if k != 201}
    assert failed_creates, "the outage must have failed some creates, which were then retried"
    keys = await faults.fetch("SELECT count(*) AS n FROM idempotency_keys WHERE state = 'DONE'")
    assert int(keys[0]["n"]) == len(job_ids)
    report("postgres restart", f"{result.line()}; create answers {dict(faults.create_attempts)}")


def most_attempts(outage: float) -> int:
    """Attempts an execution can make in an outage of ``outage`` seconds from its first failure: those whose
    shortest (half) backoffs fit in it (plus 1 s for dispatch and polling), then the one that succeeds."""
    floor, elapsed, failing = 0.25, 0.0, 1
    while elapsed + floor <= outage + 1.0:
        elapsed, failing, floor = elapsed + floor, failing + 1, min(floor * 2, 1.0)
    return failing + 1


@pytest.fixture
async def faults_without_breaker(settings_env: dict[str, str], tmp_path: Path) -> AsyncIterator[FaultStack]:
    # The jittered backoff alone is the subject here; the circuit breaker holding retries through an outage
    # is tests/e2e/test_retry_breaker.py's.
    stack = FaultStack(settings_env, tmp_path, extra_env={"SUNDIAL_BREAKER_ENABLED": "false"})
    stack.start()
    try:
        await stack.ready()
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


async def test_a_retry_storm_is_spread_and_capped_by_jittered_backoff(faults_without_breaker: FaultStack) -> None:
    faults = faults_without_breaker
    outage_sec = 8.0
    policy = {"maxAttempts": 12, "backoff": "EXPONENTIAL", "initialDelayMs": 500, "maxDelayMs": 2000, "jitter": True}
    # Each execution's handler fails for outage_sec from its scheduled time (all within 0.5 s): the outage is
    # measured from the fires, so creates slower than the lead only make some executions fire late.
    lead, spread_sec = 4 + JOBS / 400, 0.5  # the creates (~500/s) are usually done before the first fire
    bodies = one_shots(
        faults.pool,
        JOBS,
        start_in=lead,
        spread=spread_sec,
        handler="storm",
        payload={"outageSec": outage_sec},
        retry_policy=policy,
    )
    storm_ends = time.monotonic() + lead + spread_sec + outage_sec
    began = time.monotonic()
    job_ids = await faults.create_jobs(bodies)
    created_in = time.monotonic() - began
    probe_latency: list[float] = []
    # The API's latency during the storm: from the last create's answer until 2 s after the outage ends
    # (at least a few probes when the creates outlasted the storm).
    async with faults.client() as client:
        while time.monotonic() < storm_ends + 2 or len(probe_latency) < 5:
            sent = time.monotonic()
            response = await client.get(f"/v1/jobs/{job_ids[0]}")
            assert response.status_code == 200
            probe_latency.append(time.monotonic() - sent)
            await asyncio.sleep(0.2)
    await faults.wait_terminal(len(job_ids), within=120)
    result = await faults.check(job_ids, retried_handler=True)
    starts = await faults.fetch(
        "SELECT a.execution_id, a.attempt, extract(epoch FROM a.started_at) AS at,"
        " extract(epoch FROM e.scheduled_for) AS scheduled FROM execution_attempts a"
        " JOIN executions e ON e.id = a.execution_id ORDER BY a.execution_id, a.attempt"
    )
    by_execution: dict[object, list[float]] = {}
    outage_ends: dict[object, float] = {}
    for row in starts:
        by_execution.setdefault(row["execution_id"], []).append(float(row["at"]))
        outage_ends[row["execution_id"]] = float(row["scheduled"]) + outage_sec
    # Every gap between attempts honours at least half its backoff (equal jitter), so no retry loops tight.
    policy_floor = [0.25, 0.5, 1.0] + [1.0] * 20
    gaps = [t[i + 1] - t[i] for t in by_execution.values() for i in range(len(t) - 1)]
    tight = [
        (n, t[n + 1] - t[n])
        for t in by_execution.values()
        for n in range(len(t) - 1)
        if t[n + 1] - t[n] < policy_floor[n]
    ]
    assert not tight, f"retries sooner than half their backoff: {tight[:5]}"
    # The first retries of a thousand executions that failed together come back spread, not as one wave.
    second = sorted(t[1] for t in by_execution.values() if len(t) > 1)
    assert len(second) >= len(job_ids) // 2, (
        f"only {len(second)} of {len(job_ids)} executions were retried: most first attempts came after the"
        f" outage (creates took {created_in:.1f}s)"
    )
    spread = second[int(0.9 * len(second))] - second[int(0.1 * len(second))]
    assert spread >= 0.15, f"first retries bunched within {spread:.3f}s"
    # Capped: each execution makes at most the attempts whose shortest backoffs fit in the outage it saw
    # (from its own first attempt to the outage's end) — a dozen, not a retry per poll.
    seen = {e: outage_ends[e] - t[0] for e, t in by_execution.items()}  # the outage each execution saw
    over = [(len(t), round(seen[e], 1)) for e, t in by_execution.items() if len(t) > most_attempts(seen[e])]
    most = max(len(t) for t in by_execution.values())
    assert not over, f"executions attempted more often than their backoff allows (attempts, outage s): {over[:5]}"
    assert max(probe_latency) < 2.0, f"the API slowed to {max(probe_latency):.2f}s during the storm"
    assert not any(faults.restarts().values()), faults.restarts()
    mean_attempts = statistics.mean(len(t) for t in by_execution.values())
    report(
        "retry storm",
        f"{result.line()}; creates {created_in:.1f}s; attempts per execution max {most}, mean {mean_attempts:.1f};"
        f" first-retry spread p10-p90 {spread:.2f}s; mean gap {statistics.mean(gaps):.2f}s;"
        f" API p50 {statistics.median(probe_latency) * 1000:.0f}ms max {max(probe_latency) * 1000:.0f}ms",
    )
