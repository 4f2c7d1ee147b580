"""The fault suite's stack: every Sundial process, real and supervised, plus the checks each scenario ends with.

``FaultStack`` runs api, hydrator, dispatcher, sweeper and workers (``tests.faults.app``) under the real
:class:`~sundial_infra.supervisor.Supervisor` — the one behind ``make up`` — so a process a scenario kills
is restarted as it would be in development (and by systemd or Kubernetes in production). Processes that
must *not* come back (a dispatcher armed with a crash point) run beside it through the e2e ``Processes``
harness. Timings are shortened (heartbeat TTL 3 s, leases 2 s, sweeper and hydrator passes 0.5 s) so a
scenario heals in seconds.

Jobs are created through HTTP, each with an ``Idempotency-Key`` and retried (same key) until the API
acknowledges it — a client that lost its answer does exactly that. ``check()`` then holds Postgres to the
issue's promises: no acknowledged create lost, every due job terminal, at most one accepted completion
per (job, occurrence), no write committed with a stale fencing token; and it counts duplicate starts.

``SUNDIAL_FAULT_SCALE`` multiplies every scenario's job count (default 1: 1,000 jobs per scenario).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sundial_infra.supervisor import Backoff, ProcessSpec, Supervisor, sundial_argv

from tests.support.ha import eventually
from tests.support.processes import Processes, free_port
from tests.support.tenants import tenant_token

REPO_ROOT = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("SUNDIAL_FAULT_SCALE", "1") or "1")
TERMINAL = ("SUCCEEDED", "DEAD", "CANCELLED", "SKIPPED")

FAST = {
    "SUNDIAL_SHARDS": "4",
    "SUNDIAL_LEASE_TTL_SEC": "2",
    "SUNDIAL_LEASE_MARGIN_SEC": "0.5",
    "SUNDIAL_DISPATCHER_ORPHAN_GRACE_SEC": "0.5",
    "SUNDIAL_HYDRATOR_INTERVAL_SEC": "0.5",
    "SUNDIAL_HYDRATOR_OVERDUE_GRACE_SEC": "1",
    "SUNDIAL_HYDRATOR_OVERDUE_INTERVAL_SEC": "1",
    "SUNDIAL_SWEEPER_INTERVAL_SEC": "0.5",
    "SUNDIAL_SWEEPER_UNPUBLISHED_AFTER_SEC": "2",
    "SUNDIAL_SWEEPER_UNSTARTED_AFTER_SEC": "6",
    "SUNDIAL_SWEEPER_HEARTBEAT_TTL_SEC": "3",
    "SUNDIAL_SWEEPER_LOST_CONFIRM_SEC": "1.5",
    "SUNDIAL_SWEEPER_TIMEOUT_GRACE_SEC": "5",
    "SUNDIAL_WORKER_HEARTBEAT_INTERVAL_SEC": "0.5",
    "SUNDIAL_WORKER_HEARTBEAT_TTL_SEC": "3",
    "SUNDIAL_WORKER_SHUTDOWN_GRACE_SEC": "5",
    "SUNDIAL_IDEMPOTENCY_LOCK_SEC": "3",
    "SUNDIAL_LOG_LEVEL": "INFO",
}
#: Retries quick enough for a scenario to heal in seconds.
QUICK_RETRY = {"maxAttempts": 6, "backoff": "FIXED", "initialDelayMs": 500, "maxDelayMs": 500, "jitter": True}


def scaled(jobs: int) -> int:
    return max(1, int(jobs * SCALE))


def budget(seconds: float) -> float:
    """A wait that grows with the scale: ten times the jobs may take ten times as long to drain."""
    return seconds * max(1.0, SCALE)


@dataclass
class Report:
    jobs: int
    executions: int
    attempts: int
    #: Handler starts beyond the first per execution that were not retries of a failing handler: what the
    #: fault cost (at-least-once delivery's duplicates, allowed and counted).
    duplicate_starts: int
    attempt_states: Counter[str] = field(default_factory=Counter)
    execution_states: Counter[str] = field(default_factory=Counter)
    terms: int = 0

    def line(self) -> str:
        return (
            f"{self.jobs} jobs, {self.executions} executions, {self.attempts} attempts "
            f"({dict(self.attempt_states)}), {self.duplicate_starts} duplicate starts, "
            f"executions {dict(self.execution_states)}, {self.terms} dispatcher terms wrote them"
        )


class FaultStack:
    def __init__(
        self,
        env: dict[str, str],
        tmp_path: Path,
        *,
        workers: int = 2,
        dispatchers: int = 1,
        extra_env: dict[str, str] | None = None,
    ):
        self.pool = f"faults-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.database_url = env["SUNDIAL_DATABASE_URL"]
        self.env = {
            **env,
            **FAST,
            **(extra_env or {}),
            "SUNDIAL_FAULT_POOL": self.pool,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
        }
        self.logs = tmp_path / "logs"
        self.workers = [f"worker-{i}" for i in range(1, workers + 1)]
        self.dispatchers = ["dispatcher", *(f"dispatcher-{i}" for i in range(2, dispatchers + 1))]
        specs = [
            ProcessSpec("api", sundial_argv("api", "--host", "127.0.0.1", "--port", str(self.port))),
            ProcessSpec("hydrator", sundial_argv("hydrator")),
            *(
                ProcessSpec(name, sundial_argv("dispatcher"), env=(("SUNDIAL_INSTANCE_ID", name),))
                for name in self.dispatchers
            ),
            ProcessSpec("sweeper", sundial_argv("sweeper")),
            # A stable identity per worker, as `make up` gives (its process name): a restarted one knows it restarted.
            *(
                ProcessSpec(
                    name, sundial_argv("worker", "--app", "tests.faults.app:worker"), env=(("SUNDIAL_WORKER_ID", name),)
                )
                for name in self.workers
            ),
        ]
        self.supervisor = Supervisor(
            specs,
            env=self.env,
            log_dir=self.logs,
            run_dir=tmp_path / "run",
            backoff=Backoff(initial=0.2, maximum=2.0, healthy_after=5.0),
            stop_timeout=10.0,
        )
        self.extra = Processes(self.env, self.logs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.token = tenant_token(self.database_url, "faults", pools=[self.pool])
        self.base_url = f"http://127.0.0.1:{self.port}"

    # --- processes --------------------------------------------------------------------------------

    def start(self) -> None:
        self.supervisor.start()
        self._thread = threading.Thread(target=self.supervisor.run, args=(self._stop, 0.1), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        for status in self.supervisor.status():  # a SIGSTOPped process cannot act on SIGTERM
            if status.pid is not None:
                os.kill(status.pid, signal.SIGCONT)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.supervisor.stop()
        self.extra.stop_all()

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pid(self, name: str) -> int:
        [status] = [s for s in self.supervisor.status() if s.name == name]
        assert status.pid is not None, f"{name} is not running"
        return status.pid

    def restarts(self) -> dict[str, int]:
        return {s.name: s.restarts for s in self.supervisor.status()}

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.pid(name), sig)

    async def wait_for_log(self, name: str, text: str, within: float = 30.0, count: int = 1) -> None:
        await eventually(lambda: self.log(name).count(text) >= count, within, f"{name} to log {text!r} x{count}")

    async def ready(self) -> None:
        """API answering, every shard led, every worker with partitions."""

        async def api_ready() -> bool:
            try:
                async with httpx.AsyncClient(timeout=1) as client:
                    return (await client.get(f"{self.base_url}/readyz")).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(api_ready, 60, "the API to be ready")
        shards = int(self.env["SUNDIAL_SHARDS"])
        await eventually(
            lambda: sum(self.log(name).count("leading with fence token") for name in self.dispatchers) >= shards,
            30,
            f"every one of the {shards} shards led",
        )
        for name in self.workers:
            await self.wait_for_log(name, "partitions assigned", within=60)

    # --- jobs -------------------------------------------------------------------------------------

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10)

    async def create_jobs(
        self, bodies: Sequence[dict[str, Any]], *, concurrency: int = 32, within: float = 120.0
    ) -> list[str]:
        """POST each body with its own Idempotency-Key, retrying (same key) until acknowledged; the job ids."""
        limit = asyncio.Semaphore(concurrency)
        within = budget(within)
        deadline = time.monotonic() + within
        ids: list[str] = [""] * len(bodies)
        self.create_attempts: Counter[int] = Counter()

        async def create(client: httpx.AsyncClient, i: int) -> None:
            key = f"create-{self.pool}-{i}"
            async with limit:
                body = not_before(bodies[i], datetime.now(UTC) + timedelta(seconds=1))  # once: retries resend it
                while True:
                    try:
                        response = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                        self.create_attempts[response.status_code] += 1
                        if response.status_code == 201:
                            ids[i] = response.json()["jobId"]
                            return
                        assert response.status_code in (409, 503, 500), response.text
                    except httpx.HTTPError as exc:
                        self.create_attempts[type(exc).__name__] += 1  # type: ignore[index]
                    if time.monotonic() > deadline:
                        raise AssertionError(f"create {i} not acknowledged within {within}s")
                    await asyncio.sleep(0.2)

        async with self.client() as client:
            await asyncio.gather(*(create(client, i) for i in range(len(bodies))))
        return ids

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.database_url)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    async def terminal(self) -> int:
        rows = await self.fetch("SELECT count(*) AS n FROM executions WHERE state = ANY($1::text[])", list(TERMINAL))
        return int(rows[0]["n"])

    async def wait_terminal(self, jobs: int, within: float) -> None:
        within = budget(within)

        async def done() -> bool:
            try:
                return await self.terminal() >= jobs
            except (OSError, asyncpg.PostgresError):
                return False

        await eventually(done, within, f"all {jobs} executions terminal", interval=0.25)

    # --- the checks ---------------------------------------------------------------------------------

    async def check(
        self, job_ids: Sequence[str], *, expect: str = "SUCCEEDED", retried_handler: bool = False
    ) -> Report:
        """The issue's invariants against Postgres; returns the counts for the scenario's report line."""
        jobs = await self.fetch("SELECT id, name FROM jobs")
        known = {str(r["id"]) for r in jobs}
        acknowledged = set(job_ids)
        lost = acknowledged - known
        assert not lost, f"{len(lost)} acknowledged creates lost, e.g. {sorted(lost)[:3]}"
        # One job per create request: a retried create (same Idempotency-Key) never made a second one.
        names = Counter(r["name"] for r in jobs)
        doubled = {n: c for n, c in names.items() if c > 1}
        assert not doubled, f"creates that made more than one job: {list(doubled.items())[:3]}"
        assert len(jobs) == len(acknowledged), f"{len(jobs)} jobs for {len(acknowledged)} acknowledged creates"

        executions = await self.fetch("SELECT id, job_id, scheduled_for, state, attempt, shard FROM executions")
        per_job = Counter(str(r["job_id"]) for r in executions)
        missing = [j for j in acknowledged if per_job[j] == 0]
        assert not missing, f"{len(missing)} due jobs never ran, e.g. {missing[:3]}"
        assert max(per_job.values()) == 1, "an occurrence with more than one execution"
        states = Counter(r["state"] for r in executions)
        not_terminal = {s: n for s, n in states.items() if s not in TERMINAL}
        assert not not_terminal, f"executions not terminal: {not_terminal}"
        assert states == Counter({expect: len(executions)}), states

        # At most one accepted completion per (job, occurrence): one SUCCEEDED finish per execution, written
        # by its current attempt.
        completions = await self.fetch(
            "SELECT entity_id, count(*) AS n FROM audit_log WHERE entity = 'execution' AND action = 'finish'"
            " AND to_state = 'SUCCEEDED' GROUP BY entity_id HAVING count(*) > 1"
        )
        assert not completions, f"executions completed more than once: {completions[:3]}"
        stale = await self.fetch(
            "SELECT a.execution_id, a.attempt FROM execution_attempts a JOIN executions e ON e.id = a.execution_id"
            " WHERE a.state = 'SUCCEEDED' AND a.attempt <> e.attempt"
        )
        assert not stale, f"a superseded attempt's completion was accepted: {stale[:3]}"

        await self._check_fencing()

        attempts = await self.fetch("SELECT state, count(*) AS n FROM execution_attempts GROUP BY state")
        attempt_states = Counter({r["state"]: int(r["n"]) for r in attempts})
        total = sum(attempt_states.values())
        # Re-runs of the same occurrence not caused by a failing handler: the faults' duplicate starts.
        failing = attempt_states["FAILED"] + attempt_states["TIMED_OUT"] if retried_handler else 0
        terms = await self.fetch("SELECT count(DISTINCT (shard, fence_token)) AS n FROM executions")
        return Report(
            jobs=len(jobs),
            executions=len(executions),
            attempts=total,
            duplicate_starts=total - len(executions) - failing,
            attempt_states=attempt_states,
            execution_states=states,
            terms=int(terms[0]["n"]),
        )

    async def _check_fencing(self) -> None:
        """No write committed with a stale token: per shard, in the order the fence serialized them (the audit
        ids, taken while the shard_fence row lock is held), dispatch and retry writes never go down in token.
        A first dispatch's token is its execution's (when it was never retried); a retry's is in its audit row.
        """
        rows = await self.fetch(
            "SELECT a.id, e.shard, a.action,"
            " CASE WHEN a.action = 'retry' THEN (a.detail->>'fenceToken')::bigint ELSE e.fence_token END AS token"
            " FROM audit_log a JOIN executions e ON e.id = a.entity_id"
            " WHERE a.entity = 'execution' AND (a.action = 'retry' OR (a.action = 'dispatch' AND e.attempt = 1))"
            " ORDER BY a.id"
        )
        highest: dict[int, int] = defaultdict(int)
        for row in rows:
            assert row["token"] >= highest[row["shard"]], (
                f"shard {row['shard']}: a {row['action']} with token {row['token']} after {highest[row['shard']]}"
            )
            highest[row["shard"]] = row["token"]
        fences = {r["shard"]: r["token"] for r in await self.fetch("SELECT shard, token FROM shard_fence")}
        for shard, token in highest.items():
            assert fences[shard] >= token


def not_before(body: dict[str, Any], earliest: datetime) -> dict[str, Any]:
    """``body`` due no earlier than ``earliest``: a create sent after its job's planned time (a slow machine
    took longer than the lead to send the ones before it) is due just after it is sent, instead of being
    refused as a ``runAt`` more than the grace period in the past."""
    if "runAt" not in body or datetime.fromisoformat(body["runAt"].replace("Z", "+00:00")) >= earliest:
        return body
    return {**body, "runAt": earliest.isoformat(timespec="milliseconds").replace("+00:00", "Z")}


def one_shots(
    pool: str,
    count: int,
    *,
    start_in: float,
    spread: float,
    handler: str = "work",
    payload: dict[str, Any] | None = None,
    retry_policy: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``count`` ONE_SHOT bodies for ``pool`` due evenly over ``spread`` seconds, the first ``start_in`` s from now."""
    first = datetime.now(UTC) + timedelta(seconds=start_in)
    step = spread / max(1, count)
    return [
        {
            "name": f"fault-{i}",
            "type": "ONE_SHOT",
            "runAt": (first + timedelta(seconds=i * step)).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "target": {"pool": pool, "handler": handler},
            "payload": {"i": i, **(payload or {})},
            "retryPolicy": retry_policy or QUICK_RETRY,
            "timeoutSec": 30,
        }
        for i in range(count)
    ]
