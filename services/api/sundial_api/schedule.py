"""How a job's schedule becomes its first fire time: instants, time zones and the millisecond rule.

Pure functions of their arguments (``now`` is passed in), so the time logic is unit-tested without a
clock. Fire times are kept at millisecond precision because the hot window scores occurrences by epoch
milliseconds and the dispatcher matches a claimed member to its job on that exact value.
"""

from __future__ import annotations

import difflib
import functools
import re
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# RFC 3339 date-time, with the offset optional (a naive value is read in the job's time zone).
# ``datetime.fromisoformat`` alone would also take dates without a time, week dates and other ISO 8601
# forms that are not instants, so the shape is checked first.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})?$", re.ASCII)
_FRACTION = re.compile(r"\.(\d{7,9})")

# Files under the zoneinfo directory that are not IANA zone names.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


class ScheduleError(ValueError):
    """A schedule that cannot fire as given; ``field`` names the request field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


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


def truncate_ms(instant: datetime) -> datetime:
    """Drop sub-millisecond digits (the hot window's precision)."""
    return instant.replace(microsecond=instant.microsecond - instant.microsecond % 1000)


def resolve_local(local: datetime, zone: str) -> datetime:
    """A naive wall-clock time in ``zone`` as a UTC instant, with cron's DST rule (DESIGN invariant 6).

    A time that occurs twice (fall-back) means its first occurrence; a time skipped by spring-forward
    means the first instant after the gap, i.e. the transition itself.
    """
    tz = zoneinfo.ZoneInfo(zone)
    first = local.replace(tzinfo=tz, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) == local:
        return instant
    # In a gap: fold=0 reads the wall time with the offset from before the jump, which lands *after*
    # the transition by as far as the wall time is into the gap; fold=1 reads it with the offset from
    # after the jump, which lands before the transition. The transition is the first instant between the
    # two that has the later offset; tz transitions fall on whole seconds, so bisect over seconds.
    after_offset = instant.astimezone(tz).utcoffset()
    lo = int(local.replace(tzinfo=tz, fold=1).astimezone(UTC).timestamp())  # before the jump
    hi = int(instant.timestamp()) + 1  # after the jump
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(tz).utcoffset() == after_offset:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


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
    raise ScheduleError("type", f"{job_type} jobs are not supported yet")
