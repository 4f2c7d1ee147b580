"""The ``sundial`` command as a daily tool, without a server: quick help that imports no server code, a quiet
closed pipe, the token found (or where it was looked for), jobs named by name, the enums the parsers offer."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sundial_client import Client, models
from sundial_client.cli import common, connection
from sundial_client.cli.common import run
from sundial_client.cli.connection import UsageError, resolve_connection
from sundial_client.cli.executions import parser as executions_parser
from sundial_client.cli.jobs import parser as jobs_parser

JOB_ID = "0196f1c2-0000-7000-8000-000000000001"
EXECUTION_ID = "0196f1c2-0000-7000-8000-0000000000e1"
SERVER_SIDE = ("fastapi", "asyncpg", "confluent_kafka", "sundial_common", "sundial_api", "sundial_worker")


def job(name: str = "nightly-report", job_id: str = JOB_ID, **fields: Any) -> dict[str, Any]:
    return {
        "jobId": job_id,
        "name": name,
        "type": "CRON",
        "timezone": "America/Los_Angeles",
        "runAt": None,
        "delaySeconds": None,
        "schedule": "0 3 * * *",
        "intervalSec": None,
        "runList": None,
        "startAt": None,
        "endAt": None,
        "maxRuns": None,
        "jitterSec": 0,
        "overlapPolicy": "ALLOW",
        "catchupPolicy": "FIRE_ONCE",
        "catchupWindowSec": 60,
        "target": {"pool": "reports", "handler": "nightly"},
        "payload": {},
        "retryPolicy": {"maxAttempts": 3},
        "timeoutSec": 600,
        "priority": "NORMAL",
        "state": "ACTIVE",
        "nextFireAt": "2026-11-29T11:00:00Z",
        "nextScheduledFor": "2026-11-29T11:00:00Z",
        "fireCount": 4,
        "missedFires": 0,
        "version": 1,
        "createdAt": "2026-11-25T00:00:00Z",
        "updatedAt": "2026-11-25T00:00:00Z",
        **fields,
    }


def execution(**fields: Any) -> dict[str, Any]:
    return {
        "executionId": EXECUTION_ID,
        "jobId": JOB_ID,
        "scheduledFor": "2026-11-28T11:00:00Z",
        "fireAt": "2026-11-28T11:00:00Z",
        "triggered": False,
        "cancelRequestedAt": None,
        "state": "DEAD",
        "attempt": 2,
        "maxAttempts": 2,
        "shard": 1,
        "fenceToken": 7,
        "pool": "reports",
        "handler": "nightly",
        "priority": "NORMAL",
        "workerId": "w-1",
        "createdAt": "2026-11-28T11:00:00Z",
        "publishedAt": None,
        "startedAt": "2026-11-28T11:00:01Z",
        "finishedAt": "2026-11-28T11:00:02Z",
        "result": None,
        "error": "RuntimeError: no report today\nsecond line",
        "traceId": None,
        "traceLink": None,
        **fields,
    }


class Api:
    """A stand-in API answering what the commands below ask, and recording what they asked."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(f"{request.method} {request.url.path}?{request.url.query.decode()}".rstrip("?"))
        path = request.url.path
        if path.startswith("/v1/jobs:by-key/"):
            key = path.removeprefix("/v1/jobs:by-key/")
            path = next((f"/v1/jobs/{j['jobId']}" for j in self.jobs if j.get("key") == key), "/v1/jobs/-")
        if path == "/v1/jobs":
            prefix = request.url.params.get("namePrefix", "")
            found = [j for j in self.jobs if j["name"].startswith(prefix)]
            return httpx.Response(200, json={"items": found, "nextCursor": None})
        if path.startswith("/v1/jobs/"):
            ident = path.rsplit("/", 1)[-1]
            for j in self.jobs:
                if j["jobId"] == ident:
                    return httpx.Response(200, json={**j, "latestExecutions": [], "parents": [], "children": []})
            problem = {"type": "about:blank", "title": "Not Found", "status": 404, "detail": "no such job"}
            return httpx.Response(404, json=problem)
        if path == "/v1/executions":
            return httpx.Response(200, json={"items": [execution()], "nextCursor": None})
        if path == f"/v1/executions/{EXECUTION_ID}":
            attempt = {
                "attempt": 2,
                "workerId": "w-1",
                "state": "FAILED",
                "startedAt": "2026-11-28T11:00:01Z",
                "finishedAt": "2026-11-28T11:00:02Z",
                "error": "RuntimeError: no report today\nsecond line",
                "progress": {"rows": 40},
                "traceback": 'Traceback (most recent call last):\n  File "reports.py", line 9, in nightly',
            }
            return httpx.Response(200, json={**execution(), "attempts": [attempt]})
        return httpx.Response(500, json={"type": "about:blank", "title": "?", "status": 500, "detail": path})


def cli(
    api: Api, parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    with Client("http://api.test", token="t", transport=httpx.MockTransport(api)) as client:
        code = run(parser, argv, client)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_job_is_found_by_its_name_and_shown_in_its_zone(capsys: pytest.CaptureFixture[str]) -> None:
    api = Api([job(), job(name="nightly-report-eu", job_id="0196f1c2-0000-7000-8000-000000000002")])
    code, out, _ = cli(api, jobs_parser(), ["get", "nightly-report"], capsys)
    assert code == 0, out
    assert f"GET /v1/jobs/{JOB_ID}" in api.asked
    # 03:00 on the job's wall clock, with its offset, and the instant in UTC beside it
    assert "next:     2026-11-29 03:00:00-08:00 America/Los_Angeles (2026-11-29T11:00:00Z)" in out


def test_a_name_shared_by_two_jobs_is_refused_with_their_ids(capsys: pytest.CaptureFixture[str]) -> None:
    api = Api([job(), job(job_id="0196f1c2-0000-7000-8000-000000000003")])
    code, _, err = cli(api, jobs_parser(), ["pause", "nightly-report"], capsys)
    assert code == connection.USAGE and "2 jobs are called `nightly-report`" in err and JOB_ID in err
    code, _, err = cli(Api([]), jobs_parser(), ["get", "nobody"], capsys)
    assert code == common.NOT_FOUND and "no job has the key or the name `nobody`" in err


def test_a_job_is_found_by_its_key_before_its_name(capsys: pytest.CaptureFixture[str]) -> None:
    keyed = job(name="report", job_id="0196f1c2-0000-7000-8000-000000000004", key="reports/nightly")
    api = Api([job(name="reports/nightly"), keyed])
    code, out, _ = cli(api, jobs_parser(), ["get", "reports/nightly"], capsys)
    assert code == 0, out
    assert api.asked[:2] == ["GET /v1/jobs:by-key/reports/nightly", f"GET /v1/jobs/{keyed['jobId']}"]
    assert "  key:      reports/nightly" in out


def test_the_executions_list_names_the_job_and_filters_by_its_name(capsys: pytest.CaptureFixture[str]) -> None:
    api = Api([job()])
    argv = ["list", "--job", "nightly-report", "--pool", "reports", "--handler", "nightly"]
    code, out, _ = cli(api, executions_parser(), argv, capsys)
    assert code == 0, out
    header, row = out.splitlines()
    assert header.split()[:5] == ["EXECUTION", "ID", "JOB", "HANDLER", "POOL"]
    assert row.split()[1:5] == ["nightly-report", "nightly", "reports", "DEAD"]
    listing = next(a for a in api.asked if a.startswith("GET /v1/executions?"))
    assert f"jobId={JOB_ID}" in listing and "pool=reports" in listing and "handler=nightly" in listing


def test_an_execution_shows_each_attempts_progress_error_and_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(Api([job()]), executions_parser(), ["get", EXECUTION_ID], capsys)
    assert code == 0
    assert 'progress: {"rows": 40}' in out
    assert "      RuntimeError: no report today\n      second line" in out  # the whole error, not its first line
    assert 'File "reports.py", line 9, in nightly' in out


def test_create_sends_a_run_list_and_the_retry_policy(capsys: pytest.CaptureFixture[str]) -> None:
    sent: list[dict[str, Any]] = []

    def api(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(201, json=job(type="RUN_LIST", schedule=None, runList=sent[-1]["runList"]))

    argv = ["create", "--name", "n", "--key", "reports/n", "--pool", "reports", "--handler", "nightly"]
    argv += ["--at", "2027-01-01T09:00:00Z", "--at", "2027-01-02T09:00:00Z", "--max-attempts", "5"]
    argv += ["--backoff", "linear", "--initial-delay-ms", "1000", "--max-delay-ms", "60000", "--no-retry-jitter"]
    with Client("http://api.test", token="t", transport=httpx.MockTransport(api)) as client:
        assert run(jobs_parser(), argv, client) == 0
    assert (sent[0]["type"], sent[0]["key"]) == ("RUN_LIST", "reports/n")
    assert sent[0]["runList"] == ["2027-01-01T09:00:00Z", "2027-01-02T09:00:00Z"]
    assert sent[0]["retryPolicy"] == {
        "maxAttempts": 5,
        "backoff": "LINEAR",
        "initialDelayMs": 1000,
        "maxDelayMs": 60000,
        "jitter": False,
    }


def namespace(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(url=None, token=None, token_file=None, **given)


def test_the_dev_stacks_tokens_are_found_walking_up(tmp_path: Path) -> None:
    root = tmp_path / ".sundial"
    root.mkdir()
    (root / "dev-token").write_text("tenant-token\n")
    (root / "admin-token").write_text("admin-token\n")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    env = {"SUNDIAL_CONFIG": str(tmp_path / "none.toml")}
    assert resolve_connection(namespace(), env, deep).token == "tenant-token"
    assert resolve_connection(namespace(), env, deep, admin=True).token == "admin-token"
    # SUNDIAL_DEV_ROOT names the state directory from anywhere
    elsewhere = {**env, "SUNDIAL_DEV_ROOT": str(root)}
    assert resolve_connection(namespace(), elsewhere, Path("/"), admin=True).token == "admin-token"


def test_no_token_says_where_it_looked(tmp_path: Path) -> None:
    env = {"SUNDIAL_CONFIG": str(tmp_path / "none.toml")}
    with pytest.raises(UsageError) as caught:
        resolve_connection(namespace(), env, tmp_path, admin=True)
    message = str(caught.value)
    assert caught.value.code == connection.AUTH
    for place in ("--token", "$SUNDIAL_TOKEN", str(tmp_path / "none.toml"), f".sundial/admin-token in {tmp_path}"):
        assert place in message
    assert "make up" in message and "sundial token" in message


def test_the_parsers_offer_the_apis_enum_values() -> None:
    assert common.JOB_STATES == tuple(models.JobState)
    assert common.JOB_TYPES == tuple(models.JobType)
    assert common.EXECUTION_STATES == tuple(models.ExecutionState)
    assert common.OVERLAP_POLICIES == tuple(models.OverlapPolicy)
    assert common.CATCHUP_POLICIES == tuple(models.CatchupPolicy)
    assert common.PRIORITIES == tuple(models.Priority)
    assert common.BACKOFFS == tuple(models.Backoff)


def test_help_imports_no_server_code_nor_the_client() -> None:
    script = (
        "import sys\n"
        "from sundial_client.command import main\n"
        "for argv in (['--help'], ['jobs', '--help'], ['executions', 'list', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(done.stderr.split())
    assert "commands:" in done.stdout and "jobs" in done.stdout
    assert not {m for m in loaded if m.split(".")[0] in (*SERVER_SIDE, "httpx", "pydantic")}


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    script = (
        "import sys\n"
        "from sundial_client.cli.common import main, sub, top_parser\n"
        "def flood(client, args):\n"
        "    for i in range(200_000):\n"
        "        print('execution', i)\n"
        "    return 0\n"
        "def parser():\n"
        "    top, commands = top_parser('sundial test', 'floods its output')\n"
        "    sub(commands, 'flood', 'floods', flood)\n"
        "    return top\n"
        "sys.exit(main(parser, ['flood', '--token', 't']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"execution 0\n"
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == common.CLOSED_PIPE
    assert err == ""
