"""How a job's schedule fields become a schedule and its first fire: instants, time zones, bounds.

Pure functions of their arguments (``now`` is passed in), so the time logic is unit-tested without a
clock. The schedule math itself (cron across DST, intervals, run lists, jitter) is
:mod:`sundial_common.domain.schedules`, shared with the dispatcher; this module reads what a client wrote —
RFC 3339 instants, naive wall-clock times in the job's zone, the grace period for instants just past —
and refuses, naming the field, what cannot fire. Fire times are kept at millisecond precision because the
hot window scores occurrences by epoch milliseconds.
"""

from __future__ import annotations

import difflib
import functools
import re
import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sundial_common.domain.schedules import (
    MAX_RUN_LIST,
    Kind,
    ScheduleError,
    ScheduleSpec,
    next_fire,
    resolve_local,
    truncate_ms,
)

__all__ = [
    "FirstFire",
    "Resolved",
    "ScheduleError",
    "first_fire",
    "is_zone",
    "parse_instant",
    "resolve_local",
    "resolve_schedule",
    "suggest_zone",
    "truncate_ms",
]

# RFC 3339 date-time, with the offset optional (a naive value is read in the job's time zone).
# ``datetime.fromisoformat`` alone would also take dates without a time, week dates and other ISO 8601
# forms that are not instants, so the shape is checked first.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})?$", re.ASCII)
_FRACTION = re.compile(r"\.(\d{7,9})")

# Files under the zoneinfo directory that are not IANA zone names.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@dataclass(frozen=True, slots=True)
class FirstFire:
    """Where a new job starts: its stored ``run_at`` (ONE_SHOT only) and its first occurrence."""

    run_at: datetime | None
    next_fire_at: datetime


def parse_instant(text: str) -> datetime:
    """Parse an RFC 3339 date-time; the result is naive when the text carries no offset."""
    if not _RFC3339.match(text):
        raise ValueError(f"`{text}` is not an RFC 3339 date-time such as 2026-05-05T10:00:00Z")
    # Python keeps microseconds; nanosecond digits beyond them are dropped (they are truncated to
    # milliseconds anyway).
    normalized = _FRACTION.sub(lambda m: "." + m.group(1)[:6], text.upper().replace("Z", "+00:00"))
    try:
        return datetime.fromisoformat(normalized)
    except ValueError as exc:  # shape was fine, the values were not (month 13, 25:00, …)
        raise ValueError(f"`{text}` is not a valid date-time: {exc}") from None


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() - _NOT_ZONES)


def is_zone(name: str) -> bool:
    """True for an IANA time zone name this machine's tz database knows."""
    zones = _zones()
    if zones:
        return name in zones
    # No zone list installed (a minimal image): accept what zoneinfo can load.
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return name not in _NOT_ZONES


def suggest_zone(name: str) -> str | None:
    """The known zone a mistyped name most likely meant (case and separators forgiven)."""
    zones = _zones()
    by_folded = {z.casefold(): z for z in zones}
    folded = name.strip().replace(" ", "_").casefold()
    if folded in by_folded:
        return by_folded[folded]
    close = difflib.get_close_matches(folded, by_folded, n=1, cutoff=0.8)
    return by_folded[close[0]] if close else None


def first_fire(
    job_type: str,
    *,
    run_at: datetime | None,
    delay_seconds: int | None,
    zone: str,
    now: datetime,
    grace_sec: int,
) -> FirstFire:
    """The first occurrence of a new ONE_SHOT or DELAYED job, received at ``now``.

    A ONE_SHOT ``run_at`` slightly in the past (within ``grace_sec``: clock skew, a slow client) fires
    at once; further in the past it is almost certainly a mistake and is refused rather than run late.
    """
    if job_type == "ONE_SHOT":
        if run_at is None:
            raise ScheduleError("runAt", "is required for ONE_SHOT jobs")
        instant = resolve_local(run_at, zone) if run_at.tzinfo is None else run_at.astimezone(UTC)
        instant = truncate_ms(instant)
        if instant < now - timedelta(seconds=grace_sec):
            late = (now - instant).total_seconds()
            raise ScheduleError(
                "runAt",
                f"{instant.isoformat().replace('+00:00', 'Z')} is {late:.0f} s in the past; "
                f"at most {grace_sec} s in the past is accepted (and fires at once)",
            )
        return FirstFire(run_at=instant, next_fire_at=instant)
    if job_type == "DELAYED":
        if delay_seconds is None:
            raise ScheduleError("delaySeconds", "is required for DELAYED jobs")
        return FirstFire(run_at=None, next_fire_at=truncate_ms(now + timedelta(seconds=delay_seconds)))
    raise ScheduleError("type", f"{job_type} is not a one-off type; see resolve_schedule")


@dataclass(frozen=True, slots=True)
class Resolved:
    """A job's schedule as stored (instants in UTC at millisecond precision) and its next nominal fire."""

    spec: ScheduleSpec
    #: The next occurrence's nominal instant; None only when the job has no occurrence left (``runs`` used up).
    next_nominal: datetime | None


def _utc(instant: datetime | None, zone: str) -> datetime | None:
    if instant is None:
        return None
    return truncate_ms(resolve_local(instant, zone) if instant.tzinfo is None else instant.astimezone(UTC))


def _iso(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


def resolve_schedule(
    job_type: str,
    *,
    zone: str,
    now: datetime,
    grace_sec: int,
    min_interval_sec: int,
    run_at: datetime | None = None,
    delay_seconds: int | None = None,
    cron: str | None = None,
    interval_sec: int | None = None,
    run_list: Sequence[datetime] | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    max_runs: int | None = None,
    jitter_sec: int = 0,
    runs: int = 0,
) -> Resolved:
    """The schedule a client asked for, received at ``now``, and its first occurrence from now on.

    ``runs`` is how many runs the job's schedule has already started (a PATCH of a running job): when they
    use up ``max_runs`` the result has no next occurrence. Otherwise a schedule that can never fire is an
    error naming the field to fix. The request model has already checked each field on its own.
    """
    kind = Kind(job_type)
    start = _utc(start_at, zone)
    end = _utc(end_at, zone)
    if start is not None and end is not None and end < start:
        raise ScheduleError("endAt", f"{_iso(end)} is before startAt ({_iso(start)})")
    grace_start = now - timedelta(seconds=grace_sec)
    after = now
    instant: datetime | None = None
    instants: tuple[datetime, ...] = ()
    if kind is Kind.ONE_SHOT:
        first = first_fire("ONE_SHOT", run_at=run_at, delay_seconds=None, zone=zone, now=now, grace_sec=grace_sec)
        instant = first.run_at
        after = first.next_fire_at - timedelta(milliseconds=1)
    elif kind is Kind.DELAYED:
        first = first_fire("DELAYED", run_at=None, delay_seconds=delay_seconds, zone=zone, now=now, grace_sec=grace_sec)
        instant = first.next_fire_at
        after = instant - timedelta(milliseconds=1)
    elif kind is Kind.INTERVAL:
        if interval_sec is None:
            raise ScheduleError("intervalSec", "is required for INTERVAL jobs")
        if interval_sec < min_interval_sec:
            raise ScheduleError("intervalSec", f"is {interval_sec} s; the minimum is {min_interval_sec} s")
        # The grid's anchor: a first fire one interval from now unless the client chose one.
        start = start if start is not None else truncate_ms(now + timedelta(seconds=interval_sec))
    elif kind is Kind.RUN_LIST:
        if not run_list:
            raise ScheduleError("runList", "is required for RUN_LIST jobs: at least one instant")
        if len(run_list) > MAX_RUN_LIST:
            raise ScheduleError("runList", f"has {len(run_list)} instants; at most {MAX_RUN_LIST} are accepted")
        resolved = []
        for index, entry in enumerate(run_list):
            at = _utc(entry, zone)
            assert at is not None
            if at < grace_start:
                late = (now - at).total_seconds()
                raise ScheduleError(
                    f"runList[{index}]",
                    f"{_iso(at)} is {late:.0f} s in the past; at most {grace_sec} s in the past is accepted "
                    "(and fires at once)",
                )
            resolved.append(at)
        instants = tuple(sorted(set(resolved)))
        after = instants[0] - timedelta(milliseconds=1)
    elif kind is Kind.CRON and cron is None:
        raise ScheduleError("schedule", "is required for CRON jobs")
    spec = ScheduleSpec(
        kind=kind,
        timezone=zone,
        cron=cron if kind is Kind.CRON else None,
        interval_sec=interval_sec if kind is Kind.INTERVAL else None,
        run_at=instant,
        run_list=instants,
        start_at=start,
        end_at=end,
        max_runs=max_runs,
        jitter_sec=jitter_sec,
    )
    nominal = next_fire(spec, after, runs)
    if nominal is None and (max_runs is None or runs < max_runs):
        if end is not None:
            raise ScheduleError("endAt", f"the schedule has no occurrence between now and {_iso(end)}")
        raise ScheduleError(
            {Kind.CRON: "schedule", Kind.RUN_LIST: "runList"}.get(kind, "type"),
            "never fires: no date matches it" if kind is Kind.CRON else "has no occurrence left",
        )
    return Resolved(spec, nominal)
