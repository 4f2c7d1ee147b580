"""The API's pure parts: request validation, error field paths, cursors, time zones and first fire times."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sundial_api.models.executions import Attempt, Execution, render_attempt, render_execution
from sundial_api.models.jobs import Job, JobCreate, render_job
from sundial_api.pagination import InvalidCursor, decode_cursor, decode_id_cursor, encode_cursor, encode_id_cursor
from sundial_api.problems import allowed_fields, describe, field_path, suggest_field
from sundial_api.responses import dumps
from sundial_api.schedule import (
    Resolved,
    ScheduleError,
    first_fire,
    parse_instant,
    resolve_local,
    resolve_schedule,
    truncate_ms,
)
from sundial_api.settings import ApiSettings
from sundial_api.tokens import VerifiedTokens
from sundial_common.security.auth import Principal, issue_token
from sundial_common.security.encryption import TenantCipher
from sundial_common.testing.jobs import JOB_DEFAULTS

NOW = datetime(2030, 6, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "n",
        "type": "ONE_SHOT",
        "runAt": "2030-06-01T12:05:00Z",
        "target": {"pool": "demo", "handler": "echo"},
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def errors_of(data: dict[str, Any]) -> dict[str, str]:
    """field path → message, as the API would report them."""
    with pytest.raises(ValidationError) as caught:
        JobCreate.model_validate(data)
    # FastAPI prefixes body errors with "body"; do the same to exercise the real mapping.
    reported = [describe({**e, "loc": ("body", *e["loc"])}, JobCreate) for e in caught.value.errors()]
    return {e["field"]: e["message"] for e in reported}


# --- field paths and messages -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("body", "target", "pool"), "target.pool"),
        (("body", "retryPolicy", "maxAttempts"), "retryPolicy.maxAttempts"),
        (("body",), "body"),
        (("body", 17), "[17]"),
        (("body", "items", 2, "name"), "items[2].name"),
        (("query", "cursor"), "cursor"),
        (("path", "job_id"), "job_id"),
        ((), "body"),
    ],
)
def test_field_path_is_dotted_camel_case_without_the_source(loc: tuple[str | int, ...], path: str) -> None:
    assert field_path(loc) == path


def test_allowed_fields_walks_nested_models_by_alias() -> None:
    assert allowed_fields(JobCreate, ["target"]) == ["pool", "handler"]
    top = allowed_fields(JobCreate, [])
    assert top is not None and "runAt" in top and "retryPolicy" in top
    assert allowed_fields(JobCreate, ["retryPolicy"]) == [
        "maxAttempts",
        "backoff",
        "initialDelayMs",
        "maxDelayMs",
        "jitter",
    ]
    assert allowed_fields(JobCreate, ["payload"]) is None
    assert allowed_fields(JobCreate, ["nope"]) is None


@pytest.mark.parametrize(
    ("unknown", "meant"),
    [
        ("run_at", "runAt"),
        ("delay_seconds", "delaySeconds"),
        ("RetryPolicy", "retryPolicy"),
        ("timezon", "timezone"),
        ("colour", None),
    ],
)
def test_unknown_fields_get_a_did_you_mean(unknown: str, meant: str | None) -> None:
    top = allowed_fields(JobCreate, [])
    assert top is not None
    assert suggest_field(unknown, top) == meant


def test_malformed_json_names_the_body_and_where() -> None:
    error = {
        "type": "json_invalid",
        "loc": ("body", 12),
        "msg": "JSON decode error",
        "ctx": {"error": "Expecting value"},
    }
    assert describe(error, None) == {"field": "body", "message": "malformed JSON: Expecting value at character 12"}


# --- request validation -------------------------------------------------------------------------------


def test_a_minimal_one_shot_gets_the_documented_defaults() -> None:
    job = JobCreate.model_validate(body())
    assert job.run_at == datetime(2030, 6, 1, 12, 5, tzinfo=UTC)
    assert job.timezone == "UTC" and job.payload == {} and job.timeout_sec is None
    assert job.retry_policy.model_dump(by_alias=True, mode="json") == {
        "maxAttempts": 3,
        "backoff": "EXPONENTIAL",
        "initialDelayMs": 30000,
        "maxDelayMs": 3600000,
        "jitter": True,
    }
    assert job.priority == "NORMAL"


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        (body(runAt=None), "runAt", "required for ONE_SHOT"),
        (body(delaySeconds=10), "delaySeconds", "not allowed for ONE_SHOT"),
        (body(type="DELAYED", runAt=None), "delaySeconds", "required for DELAYED"),
        (body(type="DELAYED", delaySeconds=5), "runAt", "not allowed for DELAYED"),
        (body(type="INTERVAL", runAt=None), "intervalSec", "required for INTERVAL"),
        (body(type="INTERVAL", runAt=None, intervalSec=0), "intervalSec", "greater than or equal to 1"),
        (body(type="CRON", runAt=None), "schedule", "required for CRON"),
        (body(type="CRON", runAt=None, schedule="61 * * * *"), "schedule", "61 is out of range 0–59"),
        (body(type="CRON", runAt=None, schedule="* * *"), "schedule", "3 field(s)"),
        (body(type="CRON", runAt=None, schedule="0 0 1-1 * * * *"), "schedule", "7 field(s)"),
        (body(type="RUN_LIST", runAt=None), "runList", "required for RUN_LIST"),
        (body(type="RUN_LIST", runAt=None, runList=[]), "runList", "at least 1"),
        (body(type="RUN_LIST", runAt=None, runList=["2030-06-01T12:05:00Z"] * 1001), "runList", "at most 1000"),
        (body(type="RUN_LIST", runAt=None, runList=["2030-06-01T12:05:00Z", "soon"]), "runList[1]", "RFC 3339"),
        (body(schedule="* * * * *"), "schedule", "only for CRON jobs; ONE_SHOT jobs take runAt"),
        (body(intervalSec=5), "intervalSec", "only for INTERVAL jobs"),
        (body(startAt="2030-06-01T12:00:00Z"), "startAt", "only for CRON, INTERVAL and RUN_LIST"),
        (body(maxRuns=3), "maxRuns", "only for CRON, INTERVAL and RUN_LIST"),
        (body(overlapPolicy="SKIP"), "overlapPolicy", "only for CRON, INTERVAL and RUN_LIST"),
        (body(type="CRON", runAt=None, schedule="@daily", overlapPolicy="NEVER"), "overlapPolicy", "ALLOW"),
        (body(type="CRON", runAt=None, schedule="@daily", catchupPolicy="ALL"), "catchupPolicy", "FIRE_ALL"),
        (body(type="CRON", runAt=None, schedule="@daily", catchupWindowSec=0), "catchupWindowSec", "1"),
        (body(type="CRON", runAt=None, schedule="@daily", maxRuns=0), "maxRuns", "1"),
        (body(type="CRON", runAt=None, schedule="@daily", jitterSec=86401), "jitterSec", "86400"),
        (body(type="CRON", runAt=None, schedule="@daily", endAt="tomorrow"), "endAt", "RFC 3339"),
        (body(type="weekly"), "type", "ONE_SHOT"),
        (body(runAt="2030-06-01"), "runAt", "RFC 3339"),
        (body(runAt="2030-06-01T25:00:00Z"), "runAt", "not a valid date-time"),
        (body(runAt=1_900_000_000), "runAt", "string"),
        (body(timezone="Europe/Pariss"), "timezone", "did you mean `Europe/Paris`"),
        (body(timezone="localtime"), "timezone", "unknown time zone"),
        (body(target={"pool": "-demo", "handler": "echo"}), "target.pool", "not a pool name"),
        (body(target={"pool": "demo", "handler": "a b"}), "target.handler", "not a handler name"),
        (body(target={"pool": "demo", "handler": "echo", "x": 1}), "target.x", "unknown field"),
        (body(retryPolicy={"maxAttempts": 101}), "retryPolicy.maxAttempts", "100"),
        (body(retryPolicy={"initialDelayMs": 10, "maxDelayMs": 5}), "retryPolicy.maxDelayMs", "initialDelayMs"),
        (body(retryPolicy={"jitter": "yes"}), "retryPolicy.jitter", "boolean"),
        (body(timeoutSec=604801), "timeoutSec", "604800"),
        (body(timeoutSec=1.5), "timeoutSec", "integer"),
        (body(name="x" * 201), "name", "200"),
    ],
)
def test_invalid_requests_name_the_field(data: dict[str, Any], field: str, fragment: str) -> None:
    errors = errors_of(data)
    assert field in errors, errors
    assert fragment in errors[field]


def test_all_errors_are_reported_at_once() -> None:
    errors = errors_of(body(name="", priority="SOON", timezone="Nowhere", runAt=None))
    assert set(errors) == {"name", "priority", "timezone", "runAt"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2030-06-01T12:00:00Z", datetime(2030, 6, 1, 12, tzinfo=UTC)),
        ("2030-06-01t12:00:00z", datetime(2030, 6, 1, 12, tzinfo=UTC)),
        ("2030-06-01 12:00:00.5+02:00", datetime(2030, 6, 1, 10, 0, 0, 500_000, tzinfo=UTC)),
        ("2030-06-01T12:00:00.123456789Z", datetime(2030, 6, 1, 12, 0, 0, 123_456, tzinfo=UTC)),
        ("2030-06-01T12:00:00", datetime(2030, 6, 1, 12)),  # naive: read in the job's zone later
    ],
)
def test_parse_instant_accepts_rfc3339(text: str, expected: datetime) -> None:
    assert parse_instant(text) == expected
    assert (parse_instant(text).tzinfo is None) == (expected.tzinfo is None)


@pytest.mark.parametrize("text", ["2030-06-01", "12:00:00Z", "2030-W22-1T12:00:00Z", "2030-06-01T12:00Z", "now", ""])
def test_parse_instant_refuses_what_is_not_an_instant(text: str) -> None:
    with pytest.raises(ValueError):
        parse_instant(text)


# --- time zones and first fire ----------------------------------------------------------------------


def test_resolve_local_reads_wall_clock_time_in_the_zone() -> None:
    assert resolve_local(datetime(2030, 1, 15, 9, 0), "America/New_York") == datetime(2030, 1, 15, 14, tzinfo=UTC)
    assert resolve_local(datetime(2030, 7, 15, 9, 0), "America/New_York") == datetime(2030, 7, 15, 13, tzinfo=UTC)


def test_resolve_local_in_a_spring_forward_gap_means_the_end_of_the_gap() -> None:
    # 2030-03-10 02:30 does not exist in New York (02:00 EST jumps to 03:00 EDT = 07:00Z).
    assert resolve_local(datetime(2030, 3, 10, 2, 30), "America/New_York") == datetime(2030, 3, 10, 7, tzinfo=UTC)
    # Lord Howe Island moves by 30 minutes: 02:00 +10:30 (15:30Z the day before) jumps to 02:30 +11:00.
    assert resolve_local(datetime(2030, 10, 6, 2, 15), "Australia/Lord_Howe") == datetime(
        2030, 10, 5, 15, 30, tzinfo=UTC
    )


def test_resolve_local_in_a_fall_back_overlap_means_the_first_occurrence() -> None:
    # 2030-11-03 01:30 happens twice in New York: first at EDT (05:30Z), then at EST (06:30Z).
    assert resolve_local(datetime(2030, 11, 3, 1, 30), "America/New_York") == datetime(2030, 11, 3, 5, 30, tzinfo=UTC)


def test_first_fire_of_a_one_shot_is_its_run_at_at_millisecond_precision() -> None:
    run_at = datetime(2030, 6, 1, 13, 0, 0, 999_999, tzinfo=UTC)
    first = first_fire("ONE_SHOT", run_at=run_at, delay_seconds=None, zone="UTC", now=NOW, grace_sec=60)
    assert first.run_at == first.next_fire_at == datetime(2030, 6, 1, 13, 0, 0, 999_000, tzinfo=UTC)


def test_first_fire_converts_offsets_to_utc_and_reads_naive_times_in_the_zone() -> None:
    aware = datetime(2030, 6, 1, 15, 0, tzinfo=UTC).astimezone()  # any offset
    assert first_fire(
        "ONE_SHOT", run_at=aware, delay_seconds=None, zone="Asia/Tokyo", now=NOW, grace_sec=60
    ).next_fire_at == datetime(2030, 6, 1, 15, tzinfo=UTC)
    naive = datetime(2030, 6, 2, 9, 0)
    assert first_fire(
        "ONE_SHOT", run_at=naive, delay_seconds=None, zone="Asia/Tokyo", now=NOW, grace_sec=60
    ).next_fire_at == datetime(2030, 6, 2, 0, tzinfo=UTC)


def test_a_one_shot_slightly_in_the_past_fires_at_once_and_further_back_is_refused() -> None:
    recent = NOW - timedelta(seconds=60)
    assert first_fire(
        "ONE_SHOT", run_at=recent, delay_seconds=None, zone="UTC", now=NOW, grace_sec=60
    ).next_fire_at == truncate_ms(recent)
    with pytest.raises(ScheduleError) as caught:
        first_fire(
            "ONE_SHOT", run_at=NOW - timedelta(seconds=61), delay_seconds=None, zone="UTC", now=NOW, grace_sec=60
        )
    assert caught.value.field == "runAt" and "in the past" in caught.value.message


def test_first_fire_of_a_delayed_job_counts_from_now() -> None:
    first = first_fire("DELAYED", run_at=None, delay_seconds=90, zone="UTC", now=NOW, grace_sec=60)
    assert first.run_at is None
    assert first.next_fire_at == NOW + timedelta(seconds=90)
    later = first_fire(
        "DELAYED", run_at=None, delay_seconds=0, zone="UTC", now=NOW + timedelta(microseconds=1999), grace_sec=60
    )
    assert later.next_fire_at == NOW + timedelta(microseconds=1000)


def test_first_fire_is_for_one_offs_only() -> None:
    with pytest.raises(ScheduleError) as caught:
        first_fire("CRON", run_at=None, delay_seconds=None, zone="UTC", now=NOW, grace_sec=60)
    assert caught.value.field == "type"


# --- cursors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheduled_for",
    [
        NOW,
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ],
)
def test_a_cursor_round_trips_exactly(scheduled_for: datetime) -> None:
    ident = uuid.uuid4()
    cursor = encode_cursor(scheduled_for, ident)
    assert cursor.isascii() and "=" not in cursor and "/" not in cursor and "+" not in cursor
    assert decode_cursor(cursor) == (scheduled_for, ident)


@pytest.mark.parametrize(
    "cursor",
    ["", "!!!!", "dGVzdA", "djE6MTI6eHl6", "x" * 500, encode_cursor(NOW, uuid.UUID(int=0)).replace("v", "w", 1) + "A"],
)
def test_a_cursor_this_api_did_not_issue_is_refused(cursor: str) -> None:
    with pytest.raises(InvalidCursor):
        decode_cursor(cursor)


# --- views ----------------------------------------------------------------------------------------------


def test_rendered_rows_match_the_documented_views() -> None:
    ident = uuid.uuid4()
    job_row = {
        **JOB_DEFAULTS,
        "id": ident,
        "name": "n",
        "type": "ONE_SHOT",
        "run_at": NOW,
        "next_nominal_at": NOW,
        "labels": {"team": "growth"},
        "pool": "demo",
        "handler": "echo",
        "payload": {"a": 1},
        "retry_policy": {"maxAttempts": 3},
        "timeout_sec": 600,
        "next_fire_at": NOW,
        "created_at": NOW,
        "updated_at": NOW,
    }
    execution_row = {
        "id": uuid.uuid4(),
        "job_id": ident,
        "scheduled_for": NOW,
        "fire_at": NOW,
        "triggered": False,
        "cancel_requested_at": None,
        "state": "PENDING",
        "attempt": 1,
        "max_attempts": 3,
        "shard": 0,
        "fence_token": 5,
        "pool": "demo",
        "handler": "echo",
        "priority": "HIGH",
        "worker_id": None,
        "created_at": NOW,
        "published_at": None,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
        "trace_id": "ab" * 16,
    }
    attempt_row = {
        "attempt": 1,
        "worker_id": "w",
        "state": "RUNNING",
        "started_at": NOW,
        "finished_at": None,
        "error": None,
        "progress": {"p": 1},
    }

    cipher = TenantCipher("acme", bytes(32))
    job = render_job(job_row, cipher)
    execution = render_execution(execution_row, "http://jaeger/trace/{trace_id}", cipher)
    attempt = render_attempt(attempt_row, cipher)

    # Every documented field is rendered, and nothing else (a job's `warnings` belong to a create's or a PATCH's
    # answer, added there when there is something to say).
    assert set(job) == {f.alias for f in Job.model_fields.values()} - {"warnings"}
    assert set(execution) == {f.alias for f in Execution.model_fields.values()}
    assert set(attempt) == {f.alias for f in Attempt.model_fields.values()}
    Job.model_validate(job)
    Execution.model_validate(execution)
    assert execution["traceLink"] == "http://jaeger/trace/" + "ab" * 16
    assert b'"runAt":"2030-06-01T12:00:00.250000Z"' in dumps(job)
    assert render_execution({**execution_row, "trace_id": None}, "{trace_id}", cipher)["traceLink"] is None


def test_settings_refuse_a_payload_limit_above_the_request_limit() -> None:
    with pytest.raises(ValidationError, match="max_payload_bytes"):
        ApiSettings(max_payload_bytes=2 * 1024 * 1024, max_request_bytes=1024 * 1024)


# --- verified tokens ----------------------------------------------------------------------------------


def test_a_verified_token_is_remembered_until_it_expires() -> None:
    issued = time.time()
    token = issue_token("k" * 32, "acme", ttl_sec=60)
    principal = Principal("acme", "acme-service")
    tokens = VerifiedTokens()
    tokens.put(token, principal)

    assert tokens.get(token, issued) == principal
    assert tokens.get(token, issued + 61) is None  # expired: verified again (and refused) by the caller
    assert tokens.get(token, issued) is None  # and forgotten


def test_the_token_cache_is_bounded() -> None:
    tokens = VerifiedTokens(max_size=2)
    issued = [issue_token("k" * 32, tenant) for tenant in ("a", "b", "c")]
    for token in issued:
        tokens.put(token, Principal("x", "x-service"))

    assert [tokens.get(t, 0) is not None for t in issued] == [False, True, True]


# --- recurring schedules as a client writes them ------------------------------------------------------


def resolve(job_type: str, **fields: Any) -> Resolved:
    return resolve_schedule(
        job_type, zone=fields.pop("zone", "UTC"), now=NOW, grace_sec=60, min_interval_sec=5, **fields
    )


def test_a_minimal_cron_job_gets_the_documented_defaults() -> None:
    job = JobCreate.model_validate(body(type="CRON", runAt=None, schedule="*/5 * * * *"))
    assert (job.overlap_policy, job.catchup_policy, job.catchup_window_sec, job.jitter_sec) == (
        "ALLOW",
        "FIRE_ONCE",
        60,
        0,
    )
    assert resolve("CRON", cron="*/5 * * * *").next_nominal == datetime(2030, 6, 1, 12, 5, tzinfo=UTC)


def test_schedule_bounds_are_read_in_the_jobs_zone_and_must_be_in_order() -> None:
    resolved = resolve("CRON", cron="0 * * * *", zone="Asia/Tokyo", start_at=datetime(2030, 6, 2, 9, 0))
    assert resolved.spec.start_at == datetime(2030, 6, 2, 0, tzinfo=UTC)
    assert resolved.next_nominal == datetime(2030, 6, 2, 0, tzinfo=UTC)
    with pytest.raises(ScheduleError) as caught:
        resolve("CRON", cron="0 * * * *", start_at=NOW + timedelta(days=2), end_at=NOW + timedelta(days=1))
    assert caught.value.field == "endAt" and "before startAt" in caught.value.message
    with pytest.raises(ScheduleError) as caught:
        resolve("CRON", cron="0 0 * * *", end_at=NOW + timedelta(hours=1))
    assert caught.value.field == "endAt" and "no occurrence" in caught.value.message


def test_a_cron_that_never_matches_is_refused() -> None:
    with pytest.raises(ScheduleError) as caught:
        resolve("CRON", cron="0 0 30 2 *")
    assert caught.value.field == "schedule" and "never fires" in caught.value.message


def test_an_interval_is_anchored_one_interval_from_now_or_at_start_at() -> None:
    assert resolve("INTERVAL", interval_sec=60).next_nominal == truncate_ms(NOW + timedelta(seconds=60))
    anchored = resolve("INTERVAL", interval_sec=60, start_at=datetime(2030, 6, 1, 11, 0, 30, tzinfo=UTC))
    assert anchored.next_nominal == datetime(2030, 6, 1, 12, 0, 30, tzinfo=UTC)  # on the grid, after now
    with pytest.raises(ScheduleError) as caught:
        resolve("INTERVAL", interval_sec=4)
    assert caught.value.field == "intervalSec" and "minimum is 5 s" in caught.value.message


def test_a_run_list_is_sorted_deduplicated_and_refuses_instants_long_past() -> None:
    later, sooner = NOW + timedelta(hours=2), NOW + timedelta(minutes=1)
    resolved = resolve("RUN_LIST", run_list=[later, sooner, later, NOW - timedelta(seconds=30)])
    assert resolved.spec.run_list == (truncate_ms(NOW - timedelta(seconds=30)), truncate_ms(sooner), truncate_ms(later))
    assert resolved.next_nominal == truncate_ms(NOW - timedelta(seconds=30))  # within the grace: fires at once
    with pytest.raises(ScheduleError) as caught:
        resolve("RUN_LIST", run_list=[later, NOW - timedelta(seconds=61)])
    assert caught.value.field == "runList[1]" and "in the past" in caught.value.message


def test_max_runs_already_used_leaves_no_occurrence() -> None:
    assert resolve("CRON", cron="@hourly", max_runs=3, runs=3).next_nominal is None


def test_an_id_cursor_round_trips_and_belongs_to_its_own_list() -> None:
    ident = uuid.uuid4()
    jobs_cursor = encode_id_cursor("j1", ident)
    assert decode_id_cursor("j1", jobs_cursor) == ident
    for foreign in (jobs_cursor, "", "!!!!", "x" * 500, encode_cursor(NOW, ident)):
        with pytest.raises(InvalidCursor):
            decode_id_cursor("x1", foreign)  # the executions list refuses a jobs cursor and anything else
