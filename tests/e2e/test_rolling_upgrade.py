"""A rolling upgrade from the previous release misses no fire, runs none twice and stalls no pool.

The previous release's processes (api, dispatcher, the services host, a worker) run from its own commit, set up
offline in a virtualenv of their own, on a schema their own ``sundial migrate`` made. While a cron job fires
every second and one-shot jobs fall due every second, this release's migrations are applied under them, then
each process kind is replaced by this release's, one at a time (the new one started before the old one is
stopped, as a Deployment with ``maxSurge: 1, maxUnavailable: 0`` rolls). Then the code is rolled back the same
way (the workers last) with no downgrade: the previous release's processes run again on this release's schema, and a
job registered with this release's features (a key) runs on them. Afterwards every occurrence due in the window
ran exactly once, none started later than the lease TTL (plus a margin for a loaded machine), and no process
logged an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest
from sundial_common.stores.schema import upgrade

from tests.support.processes import Processes, free_port

#: The previous release: the last commit before this release's first migration.
PREVIOUS = "9fccdc3c196f1a55d91afe1ea8432b5533400909"
REPO = Path(__file__).resolve().parents[2]
LEASE_TTL_SEC = 4.0
#: What a loaded two-core machine may add to a start beyond the lease TTL.
MARGIN_SEC = 3.0
ONE_SHOTS = 45
#: Lines no process may log, unless one of ALLOWED is in them.
FORBIDDEN = ("Traceback", " ERROR ", '"level": "ERROR"', '"level":"ERROR"')
ALLOWED = ("shutdown grace",)


def _uv() -> str:
    found = shutil.which("uv") or str(REPO / ".tools" / "uv" / "bin" / "uv")
    assert Path(found).exists(), "uv is needed to set up the previous release"
    return found


@pytest.fixture(scope="session")
def previous_sundial() -> Path:
    """The previous release's ``sundial`` command, set up once per checkout (offline: no package traffic)."""
    root = REPO / ".sundial" / "previous" / PREVIOUS[:12]
    command = root / ".venv" / "bin" / "sundial"
    if not command.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
        env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(root / ".venv")}
        env.pop("VIRTUAL_ENV", None)
        subprocess.run(
            [_uv(), "sync", "--frozen", "--offline", "--no-dev", "--quiet"], cwd=root, env=env, check=True, timeout=600
        )
    return command


class Fleet:
    """The previous release's and this release's processes side by side, each with its own log."""

    def __init__(self, processes: Processes, previous: Path) -> None:
        self.processes = processes
        self.previous = str(previous)

    def start(self, name: str, *args: str, old: bool) -> None:
        if old:
            log = (self.processes.logs / f"{name}.log").open("ab")
            self.processes.running[name] = subprocess.Popen(
                [self.previous, *args],
                env=self.processes.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        else:
            self.processes.start(name, *args)

    def logs(self) -> Iterator[tuple[str, str]]:
        for path in sorted(self.processes.logs.glob("*.log")):
            yield path.stem, path.read_text(errors="replace")


def _bad_lines(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if any(mark in line for mark in FORBIDDEN) and not any(ok in line for ok in ALLOWED)
    ]


@pytest.mark.e2e
async def test_a_rolling_upgrade_from_the_previous_release_misses_no_fire(
    processes: Processes, previous_sundial: Path, blank_database: str
) -> None:
    processes.env.update(
        {"SUNDIAL_DATABASE_URL": blank_database, "SUNDIAL_LEASE_TTL_SEC": str(LEASE_TTL_SEC), "SUNDIAL_SHARDS": "4"}
    )
    fleet = Fleet(processes, previous_sundial)
    migrate = [str(previous_sundial), "migrate", "--tenant", "roll", "--pool", "demo=roll"]
    await asyncio.to_thread(subprocess.run, migrate, env=processes.env, check=True, capture_output=True, timeout=120)
    minted = await asyncio.to_thread(
        subprocess.run,
        [str(previous_sundial), "token", "--tenant", "roll"],
        env=processes.env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    token = minted.stdout.strip()

    old_api = free_port()
    fleet.start("api-old", "api", "--host", "127.0.0.1", "--port", str(old_api), old=True)
    fleet.start("dispatcher-old", "dispatcher", old=True)
    fleet.start("services-old", "services", "--run", "hydrator,sweeper,replayer", old=True)
    fleet.start("worker-old", "worker", "--app", "sundial_worker.demo:worker", old=True)
    processes.wait_http_ok("api-old", f"http://127.0.0.1:{old_api}/readyz")
    processes.wait_for_log("dispatcher-old", "leading with fence token")
    processes.wait_for_log("worker-old", "partitions assigned")

    headers = {"Authorization": f"Bearer {token}"}
    first_due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{old_api}", headers=headers, timeout=30) as api:
        cron = await api.post(
            "/v1/jobs",
            json={"name": "every-second", "type": "CRON", "schedule": "* * * * * *", "target": _target()},
        )
        assert cron.status_code == 201, cron.text
        shots = []
        for i in range(ONE_SHOTS):
            run_at = (first_due + timedelta(seconds=i)).isoformat().replace("+00:00", "Z")
            made = await api.post(
                "/v1/jobs", json={"name": f"shot-{i}", "type": "ONE_SHOT", "runAt": run_at, "target": _target()}
            )
            assert made.status_code == 201, made.text
            shots.append(made.json()["jobId"])
    cron_id = cron.json()["jobId"]

    await asyncio.sleep(3)
    await upgrade(blank_database)  # this release's migrations, under the previous release's processes
    await asyncio.sleep(2)

    migrated = datetime.now(UTC)
    new_api = await _roll_forward(fleet)
    rolled_forward = datetime.now(UTC)

    # A job of this release's own (a key), due while the code rolls back: the previous release runs it.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{new_api}", headers=headers, timeout=30) as api:
        body = {"name": "keyed", "key": "roll/keyed", "type": "DELAYED", "delaySeconds": 5, "target": _target()}
        keyed = await api.post("/v1/jobs", json=body)
        assert keyed.status_code == 201 and keyed.json()["key"] == "roll/keyed", keyed.text
    back_api = _roll_back(fleet)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{back_api}", headers=headers, timeout=30) as api:
        read = await api.get(f"/v1/jobs/{keyed.json()['jobId']}")  # the previous API reads the new schema's row
        assert read.status_code == 200 and read.json()["name"] == "keyed", read.text

    rolled = datetime.now(UTC)
    # The window: from the first due second to a few seconds after the last process was replaced.
    window_end = max(
        first_due + timedelta(seconds=ONE_SHOTS - 1), (rolled + timedelta(seconds=3)).replace(microsecond=0)
    )
    rows = await _executions_until_settled(blank_database, window_end)
    by_job: dict[str, list[asyncpg.Record]] = {}
    for row in rows:
        by_job.setdefault(str(row["job_id"]), []).append(row)

    # Every one-shot ran once and succeeded once (the keyed job too, on the rolled-back fleet).
    ran = {job: [r["state"] for r in by_job.get(job, [])] for job in [*shots, keyed.json()["jobId"]]}
    assert {job: states for job, states in ran.items() if states != ["SUCCEEDED"]} == {}
    # The cron job: one execution per second of the window, none missing, none twice.
    cron_rows = [r for r in by_job[cron_id] if first_due <= r["scheduled_for"] <= window_end]
    seconds = sorted(r["scheduled_for"] for r in cron_rows)
    expected = [first_due + timedelta(seconds=i) for i in range(int((window_end - first_due).total_seconds()) + 1)]
    assert seconds == expected, f"missing {set(expected) - set(seconds)}, twice {len(seconds) - len(set(seconds))}"
    assert {r["state"] for r in cron_rows} == {"SUCCEEDED"}
    # No pool stalled for longer than a lease TTL.
    lateness = [(r["started_at"] - r["scheduled_for"]).total_seconds() for r in [*cron_rows, *rows] if r["started_at"]]
    figures = {
        "one_shot_jobs": ONE_SHOTS,
        "cron_occurrences": len(cron_rows),
        "executions": len(rows),
        "roll_s": round((rolled_forward - migrated).total_seconds(), 1),
        "rollback_s": round((rolled - rolled_forward).total_seconds(), 1),
        "max_lateness_s": round(max(lateness), 3),
    }
    print("rolling upgrade:", json.dumps(figures))
    assert max(lateness) <= LEASE_TTL_SEC + MARGIN_SEC
    # No process logged an error, old or new.
    assert {name: _bad_lines(text) for name, text in fleet.logs()} == {name: [] for name, _ in fleet.logs()}


#: The process kinds after the API, each with its arguments and the line it logs once it takes part.
KINDS = (
    ("dispatcher", ("dispatcher",), "registered dispatcher replica"),
    ("services", ("services", "--run", "hydrator,sweeper,replayer"), "registered replayer replica"),
    ("worker", ("worker", "--app", "sundial_worker.demo:worker"), "partitions assigned"),
)


async def _roll_forward(fleet: Fleet) -> int:
    """Replace the previous release's processes (``<kind>-old``) with this release's (``<kind>-new``), one kind at
    a time; the new API's port."""
    processes = fleet.processes
    api = free_port()
    fleet.start("api-new", "api", "--host", "127.0.0.1", "--port", str(api), old=False)
    processes.wait_http_ok("api-new", f"http://127.0.0.1:{api}/readyz")
    processes.stop("api-old")
    # Each kind: the new one up (a Deployment waits for its readiness) before the old one gets SIGTERM.
    for kind, args, up in KINDS:
        fleet.start(f"{kind}-new", *args, old=False)
        processes.wait_for_log(f"{kind}-new", up)
        processes.stop(f"{kind}-old")
        await asyncio.sleep(2)
    processes.wait_for_log("dispatcher-new", "leading with fence token", timeout=LEASE_TTL_SEC * 3)
    return api


def _roll_back(fleet: Fleet) -> int:
    """Replace this release's processes with the previous release's (``<kind>-back``) on this release's schema:
    the API, dispatcher and services replicas together (each up before the one it replaces stops), then the workers
    last; the rolled-back API's port."""
    processes = fleet.processes
    api = free_port()
    fleet.start("api-back", "api", "--host", "127.0.0.1", "--port", str(api), old=True)
    for kind, args, _ in KINDS[:-1]:
        fleet.start(f"{kind}-back", *args, old=True)
    processes.wait_http_ok("api-back", f"http://127.0.0.1:{api}/readyz")
    for kind, _, up in KINDS[:-1]:
        processes.wait_for_log(f"{kind}-back", up)
    for kind in ("api", *(kind for kind, _, _ in KINDS[:-1])):
        processes.stop(f"{kind}-new")
    kind, args, up = KINDS[-1]
    fleet.start(f"{kind}-back", *args, old=True)
    processes.wait_for_log(f"{kind}-back", up)
    processes.stop(f"{kind}-new")
    processes.wait_for_log("dispatcher-back", "leading with fence token", timeout=LEASE_TTL_SEC * 3)
    return api


def _target() -> dict[str, str]:
    return {"pool": "demo", "handler": "echo"}


async def _executions_until_settled(dsn: str, window_end: datetime) -> list[asyncpg.Record]:
    """Every execution once all that was due by ``window_end`` has ended (or 90 s have passed)."""
    connection = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 90
        while True:
            open_ = await connection.fetchval(
                "SELECT count(*) FROM executions WHERE scheduled_for <= $1 AND state NOT IN ('SUCCEEDED', 'DEAD')",
                window_end,
            )
            due_now = datetime.now(UTC) > window_end + timedelta(seconds=2)
            if (due_now and open_ == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        rows: list[asyncpg.Record] = await connection.fetch(
            "SELECT job_id, state, scheduled_for, started_at FROM executions"
        )
        return rows
    finally:
        await connection.close()
