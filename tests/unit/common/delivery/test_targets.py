"""What an HTTP target's answer makes of an attempt, what its request carries, and its completion tokens."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest
from sundial_common.delivery.sender import Outcome
from sundial_common.delivery.signing import new_secret
from sundial_common.delivery.targets import (
    TargetRequest,
    check_completion_token,
    completion_token,
    completion_url,
    error_of,
    request_body,
    result_of,
    verdict,
)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, "succeeded"),
        (204, "succeeded"),
        (202, "accepted"),
        (400, "fail"),
        (404, "fail"),
        (410, "fail"),
        (302, "fail"),  # a redirect is an answer, never followed
        (408, "retry"),
        (409, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
        (None, "retry"),  # a timeout or a connection error
    ],
)
def test_each_answer_has_one_verdict(status: int | None, expected: str) -> None:
    assert verdict(Outcome(status=status)) == expected


def test_the_result_is_the_bodys_json_else_its_text_and_a_cut_body_says_so() -> None:
    assert result_of(Outcome(200, b'{"sent": 3}')) == {"sent": 3}
    assert result_of(Outcome(200, b"done")) == "done"
    assert result_of(Outcome(204)) is None
    assert result_of(Outcome(200, b'{"rows": [1, 2', truncated=True)) == {"body": '{"rows": [1, 2', "truncated": True}


def test_an_error_names_the_status_and_the_start_of_the_body() -> None:
    assert error_of(Outcome(400, b"no such list\n")) == "TargetHTTP400: the target answered 400: no such list"
    assert error_of(Outcome(None, error="no response within 30 s")).startswith("TargetUnreachable: no response")
    assert len(error_of(Outcome(500, b"x" * 10_000))) < 600


def test_the_request_carries_the_attempts_identity_and_the_completion_when_there_is_one() -> None:
    execution, job = uuid.uuid4(), uuid.uuid4()
    due = datetime(2026, 5, 5, 10, 0, tzinfo=UTC)
    request = TargetRequest(execution, job, 2, 7, due, "nightly", "reports", {"day": "2026-05-05"})
    body = orjson.loads(request_body(request))
    assert body == {
        "executionId": str(execution),
        "jobId": str(job),
        "attempt": 2,
        "fenceToken": 7,
        "scheduledFor": "2026-05-05T10:00:00+00:00",
        "handler": "nightly",
        "pool": "reports",
        "payload": {"day": "2026-05-05"},
    }
    url = completion_url("https://sundial.example.com/", "reports", execution, 2)
    assert url == f"https://sundial.example.com/v1/targets/reports/completions/{execution}/2"


def test_a_completion_token_completes_its_own_attempt_under_its_own_secret_only() -> None:
    secret, other = new_secret(), new_secret()
    execution = uuid.uuid4()
    token = completion_token(secret, execution, 1)
    assert check_completion_token([secret], execution, 1, token)
    assert check_completion_token([other, secret], str(execution), 1, token)
    assert not check_completion_token([secret], execution, 2, token)  # a retry has its own
    assert not check_completion_token([secret], uuid.uuid4(), 1, token)
    assert not check_completion_token([other], execution, 1, token)  # a rotated secret voids it
    assert not check_completion_token([secret], execution, 1, token[:-1])
