"""`sundial stats`: the tenant's history as a table or JSON, and the documented exit code for bad parameters."""

from __future__ import annotations

import json

import httpx
import pytest
from sundial_client import Client
from sundial_client.cli.common import run
from sundial_client.cli.stats import parser as stats_parser

PCT = {"p50": 12.0, "p95": 40.0, "p99": 55.5}
EXECUTIONS = {
    "from": "2026-11-22T00:00:00Z",
    "to": "2026-11-23T00:00:00Z",
    "interval": "hour",
    "groupBy": "state",
    "items": [
        {
            "start": "2026-11-22T10:00:00.000Z",
            "group": "DEAD",
            "executions": 4,
            "succeeded": 0,
            "failed": 4,
            "open": 0,
            "failureRate": 1.0,
            "latenessMs": PCT,
            "durationMs": PCT,
        }
    ],
}
HANDLER = {
    "pool": "demo",
    "handler": "fail",
    "executions": 4,
    "succeeded": 0,
    "failed": 4,
    "failureRate": 1.0,
    "durationMs": PCT,
    "topErrorClass": "RuntimeError",
}
HANDLERS = {"from": EXECUTIONS["from"], "to": EXECUTIONS["to"], "slowest": [HANDLER], "mostFailing": [HANDLER]}


def answer(request: httpx.Request) -> httpx.Response:
    if request.url.params.get("interval") == "week":
        problem = {
            "type": "tag:sundial.dev,2026:problem:validation-error",
            "title": "Unprocessable Entity",
            "status": 422,
            "detail": "`interval` must be `hour` or `day`, not `week`",
            "errors": [{"field": "interval", "message": "must be `hour` or `day`, not `week`"}],
        }
        return httpx.Response(422, json=problem, headers={"Content-Type": "application/problem+json"})
    body = EXECUTIONS if request.url.path == "/v1/stats/executions" else HANDLERS
    return httpx.Response(200, json=body)


@pytest.fixture
def client() -> Client:
    return Client("http://api.test", token="t", transport=httpx.MockTransport(answer))


def test_stats_executions_prints_one_row_per_bucket_and_group(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(stats_parser(), ["executions", "--group-by", "state"], client) == 0
    out = capsys.readouterr().out
    assert "DEAD" in out and "100.0%" in out and "40" in out


def test_stats_handlers_json_is_the_apis_shape(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(stats_parser(), ["handlers", "--json"], client) == 0
    assert json.loads(capsys.readouterr().out)["mostFailing"][0]["topErrorClass"] == "RuntimeError"


def test_a_bad_parameter_exits_4_naming_it(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(stats_parser(), ["executions", "--interval", "week"], client) == 4
    assert "interval" in capsys.readouterr().err
