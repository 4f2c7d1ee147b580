"""Which breaker moves and job outcomes are incidents users are told about (no I/O)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sundial_common.stores.breakers import breaker_incident
from sundial_sweeper.incidents import outcome_incidents

from tests.unit.sweeper.test_breaker_rules import breaker


@pytest.mark.parametrize(
    ("before", "after", "event"),
    [
        ("CLOSED", "OPEN", "breaker.opened"),
        ("OPEN", "HALF_OPEN", None),
        ("HALF_OPEN", "OPEN", None),  # a failed probe: the same outage, not a new one
        ("HALF_OPEN", "CLOSED", "breaker.closed"),
        ("OPEN", "CLOSED", "breaker.closed"),
        ("CLOSED", "CLOSED", None),
    ],
)
def test_only_leaving_and_reaching_closed_are_incidents(before: str, after: str, event: str | None) -> None:
    old = breaker(before)
    new = dataclasses.replace(breaker(after), version=old.version + 1)
    incident = breaker_incident(old, new)
    assert (incident.event if incident else None) == event
    if incident is not None:
        assert incident.incident_key == f"{event}:{new.id}:{new.version}"
        assert incident.pool == new.pool and incident.job_id is None


NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def job_row(outcome: str | None, previous: str | None, *, since: datetime = NOW - timedelta(days=1)) -> dict[str, Any]:
    return {
        "tenant_id": "acme",
        "pool": "default",
        "job_id": uuid.uuid4(),
        "job_name": "hourly",
        "handler": "report",
        "since": since,
        "execution_id": uuid.uuid4() if outcome else None,
        "outcome": outcome,
        "scheduled_for": NOW,
        "finished_at": NOW,
        "error": "Timeout: sdl1:AAAA" if outcome == "DEAD" else None,
        "previous_id": uuid.uuid4() if previous else None,
        "previous_outcome": previous,
        "previous_scheduled_for": NOW - timedelta(hours=1) if previous else None,
    }


@pytest.mark.parametrize(
    ("outcome", "previous", "event"),
    [
        ("DEAD", "SUCCEEDED", "execution.failing"),
        ("SUCCEEDED", "DEAD", "execution.recovered"),
        ("DEAD", "DEAD", None),  # still failing: told once, at the change
        ("SUCCEEDED", "SUCCEEDED", None),
        ("DEAD", None, None),  # never succeeded: each death is `execution.dead`'s to tell
        ("SUCCEEDED", None, None),
        (None, None, None),  # nothing finished yet
    ],
)
def test_only_a_change_of_outcome_is_an_incident(outcome: str | None, previous: str | None, event: str | None) -> None:
    row = job_row(outcome, previous)
    found = outcome_incidents([row])
    assert [i.event for i in found] == ([event] if event else [])
    for incident in found:
        assert incident.incident_key == f"{event}:{row['execution_id']}"
        assert incident.detail["previousExecutionId"] == str(row["previous_id"])
        # The error's class only: its message is sealed, the sweeper cannot read it.
        assert incident.detail["errorClass"] == ("Timeout" if outcome == "DEAD" else None)


def test_a_change_from_before_the_tenant_subscribed_is_not_told() -> None:
    assert outcome_incidents([job_row("DEAD", "SUCCEEDED", since=NOW + timedelta(seconds=1))]) == []
