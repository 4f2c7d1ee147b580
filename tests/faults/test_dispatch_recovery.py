"""Recovery of the dispatch path: etcd rebuilt empty, etcd down 15 s, Postgres restarted, the broker restarted empty.

Each scenario runs the real processes (two dispatcher replicas, 8 shards, one worker) with the **default**
leadership, hydrator and sweeper settings — lease TTL 5 s, hydrator overdue scan after 15 s, sweeper
"published but not started" window 60 s — so that what heals the fault is the mechanism under test, not a
shortened timer, and the recorded figures compare with the issue's (measured on ``make up``'s defaults).
A stream of one-shot jobs falls due across the fault; afterwards ``FaultStack.check`` holds Postgres to the
invariants (nothing lost, one execution per occurrence, one accepted success, no stale fence), each test
asserts a generous bound on what the fault cost, and the exact figures go to the recovery table
(``tests/faults/recovery.py``, ``make chaos``):

* longest dispatch gap — the longest time no execution was created, among those due around the fault;
* P95 and max lateness — first handler start − scheduled time, of the jobs due during the fault (and created
  before they were due).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aetcd
import httpx
import pytest
from sundial_infra.stack import LocalStack

from tests.faults.harness import FaultStack, budget, one_shots, scaled
from tests.faults.recovery import Recovery, record
from tests.support.ha import eventually

pytestmark = [pytest.mark.faults, pytest.mark.timeout(int(budget(240)))]

LEASE_TTL_SEC = 5.0
#: The defaults of the settings that decide how these faults heal (FaultStack shortens them for other tests).
DEFAULTS = {
    "SUNDIAL_SHARDS": "8",
    "SUNDIAL_LEASE_TTL_SEC": str(LEASE_TTL_SEC),
    "SUNDIAL_LEASE_MARGIN_SEC": "1",
    "SUNDIAL_DISPATCHER_ORPHAN_GRACE_SEC": "1",
    "SUNDIAL_HYDRATOR_INTERVAL_SEC": "1",
    "SUNDIAL_HYDRATOR_OVERDUE_GRACE_SEC": "15",
    "SUNDIAL_HYDRATOR_OVERDUE_INTERVAL_SEC": "10",
    "SUNDIAL_SWEEPER_INTERVAL_SEC": "2",
    "SUNDIAL_SWEEPER_UNPUBLISHED_AFTER_SEC": "5",
    "SUNDIAL_SWEEPER_UNSTARTED_AFTER_SEC": "60",
}
SETTINGS_NOTE = "defaults: lease TTL 5 s, 8 shards, 2 dispatchers, 1 worker, sweeper unstarted window 60 s"


@pytest.fixture
async def faults(settings_env: dict[str, str], tmp_path: Path) -> AsyncIterator[FaultStack]:
    stack = FaultStack(settings_env, tmp_path, workers=1, dispatchers=2, extra_env=DEFAULTS)
    stack.start()
    try:
        await stack.ready()
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


async def stream(faults: FaultStack, jobs: int, spread: float) -> tuple[asyncio.Task[list[str]], float]:
    """Start creating ``jobs`` one-shots due evenly over ``spread`` s from 4 s from now; (the creates, first due)."""
    first_due = time.time() + 4
    bodies = one_shots(faults.pool, jobs, start_in=4, spread=spread, payload={"ms": 20})
    return asyncio.create_task(faults.create_jobs(bodies)), first_due


async def until_due(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.time()))


async def figures(faults: FaultStack, fault: str, began: float, ended: float, note: str) -> Recovery:
    """The fault's cost: dispatch gap among executions due from 2 s before it to 5 s after; lateness of those
    due while it lasted (epoch seconds ``began`` … ``ended``). Recorded for ``make chaos``."""
    rows = await faults.fetch(
        "SELECT extract(epoch FROM e.scheduled_for)::float8 AS due, extract(epoch FROM e.created_at)::float8 AS made,"
        " j.created_at <= e.scheduled_for AS known_in_time,"
        " (SELECT extract(epoch FROM min(a.started_at))::float8 FROM execution_attempts a"
        "  WHERE a.execution_id = e.id) AS started FROM executions e JOIN jobs j ON j.id = e.job_id"
    )
    around = sorted(r["made"] for r in rows if began - 2 <= r["due"] <= ended + 5)
    gap = max((b - a for a, b in itertools.pairwise(around)), default=0.0)
    # Only jobs acknowledged before they were due: a create the outage itself held up (retried until Postgres
    # was back) was late before any dispatcher could see it.
    late = sorted(r["started"] - r["due"] for r in rows if began <= r["due"] <= ended and r["known_in_time"])
    assert late, f"no job was due during the fault ({began:.1f}…{ended:.1f}): the stream must cover it"
    recovery = Recovery(
        fault=fault,
        longest_dispatch_gap_s=round(gap, 3),
        p95_lateness_s=round(late[int(0.95 * (len(late) - 1))], 3),
        max_lateness_s=round(late[-1], 3),
        jobs=len(late),
        note=f"{note}; {SETTINGS_NOTE}",
    )
    record(recovery)
    print(f"\nfault {fault}: {recovery}")
    return recovery


async def fences(faults: FaultStack) -> dict[int, int]:
    return {r["shard"]: r["token"] for r in await faults.fetch("SELECT shard, token FROM shard_fence")}


async def etcd_revision(stack: LocalStack, *, advance_by: int = 0) -> int:
    """etcd's revision, after ``advance_by`` writes of a scratch key (the history of a cluster that ran a while)."""
    host, port = stack.etcd_endpoint.rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        for n in range(advance_by):
            await client.put(b"/sundial-test/scratch", str(n).encode())
        return int((await client.get_range(b"/", b"\0")).header.revision)


def dispatcher_logs(faults: FaultStack) -> str:
    return "".join(faults.log(name) for name in faults.dispatchers)


async def test_etcd_rebuilt_empty_dispatch_resumes_with_larger_tokens(faults: FaultStack, stack: LocalStack) -> None:
    """etcd's data directory wiped while Postgres keeps its own: etcd's revisions start again below the fences
    Postgres recorded, and dispatch must not care — the tokens come from Postgres."""
    jobs = scaled(500)
    creating, first_due = await stream(faults, jobs, spread=20)
    await until_due(first_due + 6)
    before = await fences(faults)
    assert len(before) == 8, before
    # Leases are renewed without writes, so a young test cluster's revision is small: give the old etcd the
    # history a cluster that ran a while has, so the new one's terms are created below it (the case under test).
    old_revision = await etcd_revision(stack, advance_by=100)
    began = time.time()
    await asyncio.to_thread(stack.etcd.stop)
    await asyncio.to_thread(shutil.rmtree, stack.etcd.data_dir / "data")
    await asyncio.to_thread(stack.etcd.start)  # a new, empty etcd: revisions from 1 again
    back = time.time()

    async def every_shard_retaken() -> bool:
        now = await fences(faults)
        return all(now[shard] > token for shard, token in before.items())

    await eventually(every_shard_retaken, budget(30), "every shard taken again by a new term")
    retaken = time.time() - back
    # The case that stopped every shard when tokens were etcd revisions: the new terms' keys were created at
    # revisions below the ones the old etcd had reached.
    assert await etcd_revision(stack) < old_revision
    job_ids = await creating
    await faults.wait_terminal(len(job_ids), within=60)
    result = await faults.check(job_ids)
    cost = await figures(
        faults, "etcd rebuilt empty", began, back + LEASE_TTL_SEC, f"etcd down {back - began:.1f}s while wiped"
    )
    print(
        f"{result.line()}; every shard re-taken {retaken:.1f}s after etcd came back; etcd revision {old_revision}"
        f" before the wipe; fences {before} -> {await fences(faults)}"
    )
    # The target is lease TTL + 1 s; twice that survives a machine twice as slow.
    assert cost.longest_dispatch_gap_s is not None and cost.longest_dispatch_gap_s <= 2 * (LEASE_TTL_SEC + 1), cost


async def test_leaders_keep_dispatching_through_a_15s_etcd_outage(faults: FaultStack, stack: LocalStack) -> None:
    """etcd stopped for 15 s (its data kept): nobody can be elected, so the leaders keep their shards and go on
    dispatching under their Postgres fence; when etcd returns their leases are still theirs (or, on a machine
    too loaded to renew them in time after etcd's restart, the shards are led again by a new election)."""
    outage = 15.0
    jobs = scaled(600)
    creating, first_due = await stream(faults, jobs, spread=outage + 12)
    await until_due(first_due + 4)
    before = await fences(faults)
    elected_before = dispatcher_logs(faults).count("now leads")  # nobody can be elected while etcd is down
    began = time.time()
    await asyncio.to_thread(stack.etcd.stop)
    await asyncio.sleep(outage)
    await asyncio.to_thread(stack.etcd.start)
    back = time.time()
    job_ids = await creating
    await faults.wait_terminal(len(job_ids), within=60)
    result = await faults.check(job_ids)
    cost = await figures(faults, "etcd down 15 s", began, back, f"etcd down {back - began:.1f}s, data kept")
    after = await fences(faults)
    changed = {shard for shard, token in after.items() if token != before.get(shard)}
    print(f"{result.line()}; shards whose term changed: {sorted(changed)}")
    # Dispatch never stopped (target: +0.5 s to P95): a generous bound, far below the outage itself.
    assert cost.p95_lateness_s is not None and cost.p95_lateness_s <= 3.0, cost
    assert cost.longest_dispatch_gap_s is not None and cost.longest_dispatch_gap_s <= LEASE_TTL_SEC, cost
    assert "etcd unreachable" in dispatcher_logs(faults)

    # The terms survived the outage: their first renewal after etcd's return says so (etcd restarting under load
    # may take seconds past the last job's end). On a heavily loaded machine the keep-alive may reach the restarted
    # etcd only after the leases' TTL: then the terms end and the shards are led again by new elections — the
    # dispatch above went on either way.
    def led_again() -> bool:
        said = dispatcher_logs(faults)
        return "etcd answers again" in said or said.count("now leads") > elected_before

    try:
        await eventually(led_again, budget(30), "a term renewed (or the shards led anew) after the outage")
    except AssertionError as failed:  # say what the leaders did instead (CI shows only this message)
        said = [line for line in dispatcher_logs(faults).splitlines() if "shard" in line or "lease" in line]
        raise AssertionError(f"{failed}; the dispatchers' last lease lines:\n" + "\n".join(said[-40:])) from None


async def test_postgres_restart_puts_claimed_work_back_at_once(faults: FaultStack, stack: LocalStack) -> None:
    """Postgres crashes (``-m immediate``) and is back in about a second: passes that fail meanwhile put what
    they claimed back into the hot window, so jobs due during the outage start as soon as it ends, not when the
    hydrator's overdue scan (15 s) finds them; creates meanwhile get a clean 503 with ``Retry-After``."""
    outage = 1.0
    jobs = scaled(500)
    creating, first_due = await stream(faults, jobs, spread=16)
    await until_due(first_due + 5)
    began = time.time()
    await asyncio.to_thread(stack.postgres.stop, "immediate")
    refused = await probe_creates(faults, lambda: time.time() - began >= outage)
    await asyncio.to_thread(stack.postgres.start)
    back = time.time()
    job_ids = await creating
    await faults.wait_terminal(len(job_ids), within=60)
    result = await faults.check(job_ids)
    cost = await figures(faults, "postgres restart", began, back, f"Postgres down {back - began:.1f}s (immediate)")
    print(f"{result.line()}; probe creates during the outage: {refused}")
    assert refused and all(status == 503 and retry_after for status, retry_after in refused), refused
    # Target: max lateness <= outage + 1 s; the generous bound stays far below the overdue scan's 15 s.
    assert cost.max_lateness_s is not None and cost.max_lateness_s <= (back - began) + 5.0, cost
    assert "put back" in dispatcher_logs(faults), "a failed pass put back what it had claimed"


async def probe_creates(faults: FaultStack, done: Callable[[], bool]) -> list[tuple[int, bool]]:
    """POST creates until ``done()``: (status, has Retry-After) of each answer (the database is down)."""
    answers: list[tuple[int, bool]] = []
    async with faults.client() as client:
        while not done() or not answers:
            try:
                response = await client.post(
                    "/v1/jobs",
                    json=one_shots(faults.pool, 1, start_in=30, spread=0)[0],
                    headers={"Idempotency-Key": f"probe-{len(answers)}-{time.monotonic_ns()}"},
                )
                answers.append((response.status_code, "retry-after" in response.headers))
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    return answers


async def test_the_broker_restarting_empty_is_noticed_and_its_messages_sent_again(
    faults: FaultStack, stack: LocalStack
) -> None:
    """The broker (memory storage) restarts with a backlog in the pool's topic: every message it held is lost.
    The sweeper notices the new incarnation and republishes every PENDING execution at once — with its 60 s
    "published but not started" window left at its default, which alone would leave them waiting a minute."""
    jobs = scaled(500)
    # Due faster than the worker runs them (32 slots x 300 ms), so a backlog sits in the topic when it is lost.
    first_due = time.time() + 4
    bodies = one_shots(faults.pool, jobs, start_in=4, spread=2, payload={"ms": 300})
    creating = asyncio.create_task(faults.create_jobs(bodies))

    async def some_done() -> bool:
        return await faults.terminal() >= jobs // 5

    await until_due(first_due)
    await eventually(some_done, budget(60), "a fifth of the jobs done")
    began = time.time()
    await asyncio.to_thread(stack.broker.restart)  # memory storage: every topic, message and offset gone
    back = time.time()
    job_ids = await creating
    # The restarted broker has been seen to drop a batch of messages acknowledged just after it came back
    # (Tansu: 36 of ~250 in one run, more in another); the sweeper's 60 s window sends those again, so the wait
    # allows it — twice: a CI run saw 3 of the 36 sent again dropped too (the last sent 2 min after the restart) —
    # and the gaps that tail makes are recorded, not asserted.
    await faults.wait_terminal(len(job_ids), within=budget(200))
    result = await faults.check(job_ids)
    first_starts = [
        r["at"]
        for r in await faults.fetch(
            "SELECT extract(epoch FROM min(started_at))::float8 AS at FROM execution_attempts GROUP BY execution_id"
        )
    ]
    lost = sorted(t for t in first_starts if t >= began)  # not started when the broker lost its messages
    start_gap = max((b - a for a, b in itertools.pairwise([began, *lost])), default=0.0)
    noticed = [line for line in faults.log("sweeper").splitlines() if "the broker restarted empty" in line]
    assert noticed, "the sweeper noticed the broker's new incarnation"
    print("\n".join(noticed))  # how many were republished, how many failed: the first thing to read on a failure
    # Lateness of every job due until the broker was back (the backlog it lost included).
    cost = await figures(faults, "broker restarted empty", first_due, back, f"broker down {back - began:.1f}s")
    record(dataclasses.replace(cost, longest_start_gap_s=round(start_gap, 3)))
    # Target: republished within lease TTL + 2 s (7 s), not after the 60 s window; twice that as the bound.
    bound = back + 2 * (LEASE_TTL_SEC + 2)
    soon = sum(1 for t in lost if t <= bound)
    print(f"{result.line()}; longest start gap {start_gap:.2f}s from the restart; {soon} of {len(lost)} lost soon")
    assert lost and lost[0] <= bound, "work resumed within the bound, not after the outbox scan's 60 s window"
    assert soon >= len(lost) / 2, f"only {soon} of {len(lost)} started within the bound: the republish did not act"
