"""``sundial_client`` and the ``sundial jobs|executions`` CLI against the real API (uvicorn on a real port,
real Postgres and Redis): what a tenant service and an operator see, and what was written.

The API runs in a thread of this process on the test API port (``TEST_PORTS.api`` + the session's offset),
so the blocking client, the async client and the CLI all go over real HTTP and real sockets.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
import uvicorn
from sundial_api import ApiSettings, create_app
from sundial_client import AsyncClient, Client, Conflict, NotFound, Retries, ValidationFailed, WaitTimedOut
from sundial_client.cli.common import run
from sundial_client.cli.executions import parser as executions_parser
from sundial_client.cli.jobs import parser as jobs_parser
from sundial_client.cli.tenants import parser as tenants_parser
from sundial_common.domain.ids import new_id
from sundial_common.security.auth import issue_token

from tests.support.pools import admit
from tests.support.ports import session_ports
from tests.support.tenants import tenant_token

SECRET = "test-signing-key-for-the-client-suite"
TENANT = "acme"


@dataclass
class Served:
    url: str
    token: str
    database_url: str


@pytest.fixture
def served(database_url: str, redis_url: str) -> Iterator[Served]:
    ports, _ = session_ports()
    settings = ApiSettings(database_url=database_url, redis_url=redis_url, jwt_secret=SECRET, shards=4)
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=ports.api, lifespan="on", log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="client-suite-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the API did not start"
        assert time.monotonic() < deadline, "the API did not start within 30 s"
        time.sleep(0.05)
    try:
        token = tenant_token(database_url, TENANT, secret=SECRET, pools=["demo"])
        yield Served(f"http://127.0.0.1:{ports.api}", token, database_url)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def quick() -> Retries:
    return Retries(attempts=4, backoff_base_sec=0.01, backoff_cap_sec=0.05)


@pytest.fixture
def client(served: Served) -> Iterator[Client]:
    with Client(served.url, token=served.token, retry=quick()) as c:
        yield c


@pytest.fixture
async def aclient(served: Served) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(served.url, token=served.token, retry=quick()) as c:
        yield c


async def count_jobs(database_url: str, name: str) -> int:
    db = await asyncpg.connect(database_url)
    try:
        return int(await db.fetchval("SELECT count(*) FROM jobs WHERE name = $1", name))
    finally:
        await db.close()


# --- the client -----------------------------------------------------------------------------------


def test_helpers_register_each_kind_of_job(client: Client) -> None:
    at = datetime.now(UTC) + timedelta(hours=2)
    one_shot = client.schedule(handler="echo", pool="demo", at=at, payload={"n": 1})
    delayed = client.schedule(handler="echo", pool="demo", name="later").after(seconds=30)
    nightly = client.schedule(handler="report", pool="demo").cron("0 3 * * *", tz="America/Los_Angeles")
    assert (one_shot.type, one_shot.payload, one_shot.run_at) == (
        "ONE_SHOT",
        {"n": 1},
        at.replace(microsecond=at.microsecond // 1000 * 1000),
    )
    assert (delayed.type, delayed.name, delayed.delay_seconds) == ("DELAYED", "later", 30)
    assert (nightly.schedule, nightly.timezone, nightly.state) == ("0 3 * * *", "America/Los_Angeles", "ACTIVE")
    fires = client.jobs.preview(nightly.job_id, count=2).fires
    assert [f.local[11:19] for f in fires] == ["03:00:00", "03:00:00"]


def test_list_pages_through_every_job_once_while_others_are_created(client: Client) -> None:
    created = [client.schedule(handler="echo", pool="demo", name=f"page-{i}").after(seconds=600) for i in range(7)]
    client.schedule(handler="other", pool="demo", name="x-other").after(seconds=600)
    seen = []
    for job in client.jobs.list(name_prefix="page-", page_size=3):
        seen.append(job.job_id)
        if len(seen) == 1:  # a job created mid-listing is newer than the cursor: never shifts a page
            client.schedule(handler="echo", pool="demo", name="page-late").after(seconds=600)
    assert seen == [j.job_id for j in reversed(created)]
    assert [j.name for j in client.jobs.list(handler="other")] == ["x-other"]
    assert [j.name for j in client.jobs.list(state="PAUSED")] == []


def test_pause_resume_trigger_update_delete(client: Client) -> None:
    job = client.schedule(handler="echo", pool="demo").every(60)
    assert client.jobs.pause(job.job_id).state == "PAUSED"
    assert client.jobs.pause(job.job_id).state == "PAUSED"  # idempotent, so safe to retry
    assert client.jobs.resume(job.job_id).state == "ACTIVE"
    changed = client.jobs.update(job.job_id, if_match=job.version + 2, name="renamed", payload={"k": "v"})
    assert (changed.name, changed.payload) == ("renamed", {"k": "v"})
    triggered = client.jobs.trigger(job.job_id)
    assert triggered.job_id == job.job_id
    assert client.jobs.delete(job.job_id).state == "CANCELLED"
    with pytest.raises(Conflict):
        client.jobs.pause(job.job_id)


def test_a_stale_version_is_refused(client: Client) -> None:
    job = client.schedule(handler="echo", pool="demo").every(60)
    client.jobs.update(job.job_id, name="first")
    with pytest.raises(Exception) as caught:
        client.jobs.update(job.job_id, if_match=job.version, name="second")
    assert getattr(caught.value, "status", None) == 412


def test_validation_errors_carry_the_field_messages(client: Client) -> None:
    with pytest.raises(ValidationFailed) as caught:
        client.schedule(handler="echo", pool="Not A Pool").cron("61 * * * *")
    fields = {e.field: e.message for e in caught.value.errors}
    assert set(fields) == {"target.pool", "schedule"}
    assert "is not a pool name" in fields["target.pool"]
    with pytest.raises(NotFound):
        client.jobs.get(str(uuid.uuid4()))


async def test_cancel_and_retry_executions(aclient: AsyncClient, served: Served) -> None:
    job = await aclient.schedule(handler="echo", pool="demo").after(seconds=600)
    db = await asyncpg.connect(served.database_url)
    try:
        pending, dead = new_id(), new_id()
        for ident, state, at in ((pending, "PENDING", 1), (dead, "DEAD", 2)):
            await db.execute(
                "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, state, attempt,"
                " max_attempts, pool, handler, timeout_sec)"
                " SELECT $1, tenant_id, id, now() + make_interval(secs => $3), shard, 1, $2, 3, 3,"
                " pool, handler, 600 FROM jobs WHERE id = $4",
                ident,
                state,
                at,
                uuid.UUID(job.job_id),
            )
    finally:
        await db.close()
    cancelled = await aclient.executions.cancel(str(pending))
    assert cancelled.state == "CANCELLED" and cancelled.ended
    with pytest.raises(Conflict) as caught:
        await aclient.executions.cancel(str(pending))
    assert "nothing to cancel" in caught.value.detail
    assert [e.execution_id async for e in aclient.executions.list("DEAD")] == [str(dead)]
    retried = await aclient.executions.retry(str(dead))
    assert retried.next_attempt_at is not None and not retried.ended
    assert [e.execution_id async for e in aclient.jobs.executions(job.job_id, page_size=1)] == [str(dead), str(pending)]


class DropFirstResponse(httpx.HTTPTransport):
    """The server processes the first request, then the connection drops before its answer arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = super().handle_request(request)
        if len(self.requests) == 1:
            response.read()
            response.close()
            raise httpx.RemoteProtocolError("connection dropped before the response", request=request)
        return response


async def test_a_create_retried_after_a_dropped_connection_registers_one_job(served: Served) -> None:
    transport = DropFirstResponse()
    with Client(served.url, token=served.token, retry=quick(), transport=transport) as client:
        job = client.schedule(handler="echo", pool="demo", name="exactly-once").after(seconds=60)
    keys = [r.headers["Idempotency-Key"] for r in transport.requests]
    assert len(keys) == 2 and keys[0] == keys[1]
    assert await count_jobs(served.database_url, "exactly-once") == 1
    assert job.name == "exactly-once"


class TooManyRequestsFirst(httpx.HTTPTransport):
    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times
        self.forwarded = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.times:
            self.times -= 1
            return httpx.Response(
                429,
                headers={"Retry-After": "2"},
                json={"type": "about:blank", "title": "Too Many Requests", "status": 429, "detail": "slow down"},
            )
        self.forwarded += 1
        return super().handle_request(request)


def test_429_backs_off_for_retry_after_then_succeeds(served: Served) -> None:
    waits: list[float] = []
    transport = TooManyRequestsFirst(times=2)
    with Client(served.url, token=served.token, retry=quick(), transport=transport, sleep=waits.append) as client:
        job = client.schedule(handler="echo", pool="demo").after(seconds=60)
    assert waits == [2.0, 2.0] and transport.forwarded == 1 and job.state == "ACTIVE"


def test_create_many_sends_chunks_and_reports_each_item(client: Client) -> None:
    draft = [
        {"name": f"bulk-{i}", "type": "DELAYED", "delaySeconds": 60, "target": {"pool": "demo", "handler": "echo"}}
        for i in range(5)
    ]
    draft[3]["delaySeconds"] = -1
    results = client.jobs.create_many(draft, chunk_size=2)
    assert [(r.index, r.status) for r in results] == [(0, 201), (1, 201), (2, 201), (3, 422), (4, 201)]
    assert results[3].problem is not None and results[3].problem.errors[0].field == "delaySeconds"
    assert len(list(client.jobs.list(name_prefix="bulk-"))) == 4


# --- the CLI --------------------------------------------------------------------------------------


def cli(parser: Any, argv: list[str], client: Client, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = run(parser, argv, client)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_creates_lists_pauses_and_shows_jobs(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(
        jobs_parser(),
        [
            "create",
            "--name",
            "report",
            "--pool",
            "demo",
            "--handler",
            "echo",
            "--delay",
            "30",
            "--payload",
            '{"a": 1}',
            "--json",
        ],
        client,
        capsys,
    )
    assert code == 0
    job = json.loads(out)
    assert (job["type"], job["delaySeconds"], job["payload"]) == ("DELAYED", 30, {"a": 1})
    code, out, _ = cli(
        jobs_parser(),
        [
            "create",
            "--name",
            "nightly",
            "--pool",
            "demo",
            "--handler",
            "echo",
            "--cron",
            "0 3 * * *",
            "--tz",
            "America/Los_Angeles",
        ],
        client,
        capsys,
    )
    assert code == 0 and "cron 0 3 * * * America/Los_Angeles" in out
    assert cli(jobs_parser(), ["pause", job["jobId"]], client, capsys)[0] == 0
    code, out, _ = cli(jobs_parser(), ["list", "--state", "ACTIVE", "--json"], client, capsys)
    assert [j["name"] for j in json.loads(out)] == ["nightly"]
    code, out, _ = cli(jobs_parser(), ["list"], client, capsys)
    assert out.splitlines()[0].split()[:3] == ["JOB", "ID", "NAME"] and len(out.splitlines()) == 3
    code, out, _ = cli(jobs_parser(), ["get", job["jobId"]], client, capsys)
    assert code == 0 and "PAUSED" in out


def test_cli_errors_print_field_messages_with_documented_exit_codes(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(
        jobs_parser(),
        ["create", "--name", "bad", "--pool", "demo", "--handler", "echo", "--cron", "61 * * * *"],
        client,
        capsys,
    )
    assert code == 4 and "schedule:" in err
    code, _, err = cli(jobs_parser(), ["get", str(uuid.uuid4())], client, capsys)
    assert code == 3 and "not found" in err
    job = client.schedule(handler="echo", pool="demo").after(seconds=60)
    client.jobs.delete(job.job_id)
    assert cli(jobs_parser(), ["resume", job.job_id], client, capsys)[0] == 5
    code, _, err = cli(jobs_parser(), ["create", "--name", "x", "--pool", "demo", "--handler", "echo"], client, capsys)
    assert code == 2 and "exactly one of" in err
    with pytest.raises(SystemExit) as exited:
        run(jobs_parser(), ["--help"], client)
    assert exited.value.code == 0 and "exit codes" in capsys.readouterr().out


def test_cli_unreachable_api_exits_7(capsys: pytest.CaptureFixture[str]) -> None:
    with Client("http://127.0.0.1:9", retry=Retries(attempts=2, backoff_base_sec=0.0)) as nowhere:
        code, _, err = cli(executions_parser(), ["get", str(uuid.uuid4())], nowhere, capsys)
    assert code == 7 and "cannot reach the API" in err


def test_cli_watches_an_execution_until_it_ends(
    client: Client, served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    job = client.schedule(handler="echo", pool="demo").after(seconds=600)
    ident = new_id()

    async def insert() -> None:
        db = await asyncpg.connect(served.database_url)
        try:
            await db.execute(
                "INSERT INTO executions (id, tenant_id, job_id, scheduled_for, shard, fence_token, state, attempt,"
                " max_attempts, pool, handler, timeout_sec)"
                " SELECT $1, tenant_id, id, now(), shard, 1, 'PENDING', 1, 3, pool, handler,"
                " 600 FROM jobs WHERE id = $2",
                ident,
                uuid.UUID(job.job_id),
            )
        finally:
            await db.close()

    asyncio.run(insert())  # a fresh loop: this test is synchronous
    cancel = threading.Timer(0.5, lambda: client.executions.cancel(str(ident)))
    cancel.start()
    try:
        code, out, _ = cli(executions_parser(), ["watch", str(ident), "--interval", "0.1"], client, capsys)
    finally:
        cancel.join()
    assert code == 1
    assert [line.split()[1] for line in out.splitlines()] == ["PENDING", "CANCELLED"]


def test_sundial_tenants_registers_changes_suspends_and_resumes(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = Client(served.url, token=issue_token(SECRET, "ops", admin=True))
    tenant = Client(served.url, token=issue_token(SECRET, "newco"), retry=Retries(attempts=1))

    def tenants(*argv: str, client: Client = admin) -> tuple[int, str]:
        code = run(tenants_parser(), list(argv), client=client)
        return code, capsys.readouterr().out

    assert tenants("create", "newco", "--weight", "2", "--max-active-jobs", "10", "--json")[0] == 0
    assert tenants("create", "newco")[0] == 5  # already registered: a conflict
    admit(served.database_url, "demo", "newco")  # shared with acme: work only goes into a pool newco may use
    assert tenant.schedule(handler="echo", pool="demo", name="n").after(seconds=60).name == "n"
    code, out = tenants("update", "newco", "--max-active-jobs", "unlimited", "--max-dispatch-per-sec", "50", "--json")
    assert code == 0 and json.loads(out)["quotas"] == {
        "maxActiveJobs": None,
        "maxCreatesPerSec": None,
        "maxConcurrentExecutions": None,
        "maxDispatchPerSec": 50.0,
    }
    assert json.loads(out)["weight"] == 2
    assert tenants("suspend", "newco")[0] == 0
    assert tenants("show", "newco")[1].splitlines()[1].split()[1] == "SUSPENDED"
    assert tenants("list", client=tenant)[0] == 6  # not an admin token
    assert tenants("resume", "newco")[0] == 0
    assert "newco" in tenants("list")[1]


def test_dependencies_and_backfills_through_the_client_and_the_cli(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    parent = client.schedule(handler="echo", pool="demo").every(60, start_at=start)
    code, out, _ = cli(
        jobs_parser(),
        [
            "create",
            "--name",
            "after",
            "--pool",
            "demo",
            "--handler",
            "echo",
            "--after",
            f"{parent.job_id}:ANY",
            "--json",
        ],
        client,
        capsys,
    )
    assert code == 0, out
    child = json.loads(out)
    assert child["type"] == "DEPENDENT"
    detail = client.jobs.get(parent.job_id)
    assert [(c.job_id, c.on) for c in detail.children] == [(child["jobId"], "ANY")]
    code, _, err = cli(jobs_parser(), ["delete", parent.job_id], client, capsys)
    assert code == 5 and child["jobId"] in err  # CONFLICT: a child waits on it

    dry = client.jobs.backfill_dry_run(parent.job_id, start, start + timedelta(minutes=10))
    assert dry.count == 10 and dry.first[0] == start
    code, out, _ = cli(
        jobs_parser(),
        ["backfill", parent.job_id, "--from", start.isoformat(), "--to", (start + timedelta(minutes=10)).isoformat()],
        client,
        capsys,
    )
    assert code == 0 and "0/10 created" in out, out
    backfill_id = out.split()[1]
    assert client.jobs.cancel_backfill(backfill_id).state == "CANCELLED"
    assert client.jobs.delete(parent.job_id, cascade=True).state == "CANCELLED"
    assert client.jobs.get(child["jobId"]).state == "CANCELLED"


def test_a_triggered_run_is_readable_before_its_dispatch(
    client: Client, served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    # No dispatcher runs here: the execution a trigger names stays the trigger's until a shard leader creates it.
    job = client.schedule(handler="echo", pool="demo", name="on-demand").every(3600)
    triggered = client.jobs.trigger(job.job_id)
    pending = client.executions.get(triggered.execution_id)
    assert (pending.state, pending.triggered, pending.attempts, pending.fence_token) == ("PENDING", True, [], 0)
    assert (pending.job_id, pending.scheduled_for, pending.handler) == (job.job_id, triggered.scheduled_for, "echo")
    # the same for curl: a 200, not a 404
    answer = httpx.get(
        f"{served.url}/v1/executions/{triggered.execution_id}", headers={"Authorization": f"Bearer {served.token}"}
    )
    assert answer.status_code == 200 and answer.json()["state"] == "PENDING"
    with pytest.raises(WaitTimedOut) as caught:
        client.executions.wait(triggered.execution_id, poll_sec=0.05, timeout=0.3)
    assert caught.value.last.state == "PENDING"
    code, out, _ = cli(executions_parser(), ["get", triggered.execution_id], client, capsys)
    assert code == 0 and "waiting:    for its shard's leader to dispatch it" in out
    with pytest.raises(NotFound):
        client.executions.get(str(uuid.uuid4()))


def test_a_jobs_backfills_are_listed_by_the_client_and_the_cli(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    job = client.schedule(handler="echo", pool="demo", name="hourly-sums").every(60, start_at=start)
    first = client.jobs.backfill(job.job_id, start, start + timedelta(minutes=5))
    second = client.jobs.backfill(job.job_id, start + timedelta(minutes=5), start + timedelta(minutes=8))
    listed = list(client.jobs.backfills(job.job_id, page_size=1))
    assert [(b.backfill_id, b.total) for b in listed] == [(second.backfill_id, 3), (first.backfill_id, 5)]
    code, out, _ = cli(jobs_parser(), ["backfills", "hourly-sums"], client, capsys)  # by the job's name
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == [second.backfill_id, first.backfill_id]
    with pytest.raises(NotFound):
        list(client.jobs.backfills(str(uuid.uuid4())))
