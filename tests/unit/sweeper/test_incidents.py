"""Which breaker moves are incidents users are told about (no I/O)."""

from __future__ import annotations

import dataclasses

import pytest
from sundial_sweeper.incidents import breaker_incident

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
