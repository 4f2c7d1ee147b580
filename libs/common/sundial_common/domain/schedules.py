"""Schedule math: when does a job fire next? Pure functions of their arguments (no clock, no I/O).

A job's schedule is a :class:`ScheduleSpec` — one of five kinds:

``ONE_SHOT`` / ``DELAYED``
    one instant (``run_at``; a DELAYED job's instant is fixed when it is created).
``CRON``
    a cron expression evaluated in the job's IANA time zone: 5 fields (``minute hour day month weekday``)
    or 6 with seconds *first* (``second minute hour day month weekday``, the Quartz/Spring order), or an
    ``@hourly``-style alias. Day of month and day of week follow standard cron: when both are restricted a
    day matches if *either* does. ``L`` (last day of the month), ``L5`` (last Friday) and ``1#2`` (second
    Monday) are understood; ``W`` and hashed ``H`` fields are refused.
``INTERVAL``
    every ``interval_sec`` seconds of real time, at ``start_at + k × interval`` (k ≥ 0). Anchoring on
    ``start_at`` means a late fire never shifts the ones after it.
``RUN_LIST``
    explicit instants (at most :data:`MAX_RUN_LIST`).

``start_at`` / ``end_at`` bound every kind (fires at or after the first, at or before the second) and
``max_runs`` caps how many runs the schedule starts.

**Daylight saving time** (DESIGN invariant 6, classic cron's rule). A cron expression names wall-clock
times; where the wall clock skips or repeats, it depends on the hour field:

* a *fixed* hour field (``30 2 * * *``, ``0 9-17 * * *``) names local times. One skipped by spring-forward
  fires at the first instant after the gap (03:00 when 02:00–02:59 does not exist); one that occurs twice
  at fall-back fires once, at its first occurrence;
* a *wildcard or stepped* hour field (``0 * * * *``, ``*/15 * * * *``, ``0 */2 * * *``) follows real time:
  it fires at every instant whose wall-clock time matches — both 01:00s at fall-back, none in the gap.

Every next fire is computed from the expression and the previous fire, never by adding a period to it, so
an error cannot accumulate. Fire instants are whole milliseconds, the precision of hot-window scores.

**Jitter** is deterministic: the same job and nominal instant always get the same delay (a hash of both),
so re-hydrating the hot window or restarting the dispatcher never moves a fire.
"""

from __future__ import annotations

import bisect
import calendar
import enum
import functools
import hashlib
import zoneinfo
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from uuid import UUID

#: The most instants a RUN_LIST may hold.
MAX_RUN_LIST = 1000
#: How far ahead a cron expression is searched for its next match. A 29 February that is also the fifth
#: Monday of the month comes round every 28 years (40 across a century that skips its leap year).
CRON_SEARCH_YEARS = 50

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class Kind(enum.StrEnum):
    ONE_SHOT = "ONE_SHOT"
    DELAYED = "DELAYED"
    CRON = "CRON"
    INTERVAL = "INTERVAL"
    RUN_LIST = "RUN_LIST"
    #: No clock: fires when its parents complete (sundial_dispatcher.triggers). It has no occurrence here.
    DEPENDENT = "DEPENDENT"


RECURRING = frozenset({Kind.CRON, Kind.INTERVAL, Kind.RUN_LIST})


class ScheduleError(ValueError):
    """A schedule that cannot fire as given; ``field`` names the request field at fault (camelCase)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# --- instants ---------------------------------------------------------------------------------------------


def to_ms(instant: datetime) -> int:
    """Epoch milliseconds, exactly (integer arithmetic; sub-millisecond digits are dropped)."""
    return (instant - _EPOCH) // _MS


def from_ms(ms: int) -> datetime:
    return _EPOCH + ms * _MS


def truncate_ms(instant: datetime) -> datetime:
    """Drop sub-millisecond digits (the hot window's precision)."""
    return instant.replace(microsecond=instant.microsecond - instant.microsecond % 1000)


def _transition(local: datetime, tz: zoneinfo.ZoneInfo) -> datetime:
    """The first instant after the spring-forward gap that swallowed the naive wall time ``local``.

    fold=0 reads the wall time with the offset from before the jump, which lands *after* the transition by
    as far as the wall time is into the gap; fold=1 reads it with the offset from after the jump, which lands
    before the transition. The transition is the first instant between the two that has the later offset;
    tz transitions fall on whole seconds, so bisect over seconds.
    """
    after = local.replace(tzinfo=tz, fold=0).astimezone(UTC)
    after_offset = after.astimezone(tz).utcoffset()
    lo = int(local.replace(tzinfo=tz, fold=1).astimezone(UTC).timestamp())  # before the jump
    hi = int(after.timestamp()) + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(tz).utcoffset() == after_offset:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def resolve_local(local: datetime, zone: str) -> datetime:
    """A naive wall-clock time in ``zone`` as a UTC instant, with cron's DST rule (DESIGN invariant 6).

    A time that occurs twice (fall-back) means its first occurrence; a time skipped by spring-forward
    means the first instant after the gap, i.e. the transition itself.
    """
    first, _second, _skipped = _instants(local, zoneinfo.ZoneInfo(zone))
    return first


def _instants(local: datetime, tz: zoneinfo.ZoneInfo) -> tuple[datetime, datetime | None, bool]:
    """The instants at which ``tz``'s wall clock shows ``local``.

    Returns (first instant, second instant if the time is repeated, whether it was skipped). A skipped
    time's "first instant" is the end of its gap, where classic cron fires it.
    """
    aware = local.replace(tzinfo=tz)
    first = aware.astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) != local:
        return _transition(local, tz), None, True
    again = local.replace(tzinfo=tz, fold=1)
    if again.utcoffset() != aware.utcoffset():
        return first, again.astimezone(UTC), False
    return first, None, False


def parse_zone(zone: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError("timezone", f"unknown time zone `{zone}`") from None


# --- cron ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: the values each field allows, in ascending order."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    #: Days of the month the field allows.
    days: frozenset[int]
    #: ``L`` in the day-of-month field.
    last_day: bool
    #: Weekdays the field allows (0 = Sunday).
    weekdays: frozenset[int]
    #: weekday → which of its occurrences in the month (1–5, or 0 for the last): ``1#2``, ``L5``.
    nth: Mapping[int, frozenset[int]]
    #: Classic cron's day rule: when either day field is a wildcard (starts with ``*``, even ``*/2``) a day
    #: must match both; when both are restricted it must match either.
    day_wildcard: bool
    #: True when the hour field is a wildcard or a step: the expression follows real time across DST.
    real_time: bool

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        if self.last_day and not dom:
            dom = day.day == calendar.monthrange(day.year, day.month)[1]
        weekday = day.isoweekday() % 7
        wanted = self.nth.get(weekday)
        if wanted is None:
            dow = weekday in self.weekdays
        else:
            dow = (day.day - 1) // 7 + 1 in wanted or (
                0 in wanted and day.day + 7 > calendar.monthrange(day.year, day.month)[1]
            )
        return (dom and dow) if self.day_wildcard else (dom or dow)

    def local_matches(self, start: datetime, until_year: int) -> Iterator[datetime]:
        """Naive wall-clock times at or after ``start`` that match, ascending, up to the end of ``until_year``."""
        day = start.date()
        first_day = True
        while day.year <= until_year:
            if day.month not in self.months:
                day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
                first_day = False
                continue
            if self.day_matches(day):
                for hour in self.hours:
                    if first_day and hour < start.hour:
                        continue
                    for minute in self.minutes:
                        if first_day and (hour, minute) < (start.hour, start.minute):
                            continue
                        for second in self.seconds:
                            candidate = datetime(day.year, day.month, day.day, hour, minute, second)
                            if not first_day or candidate >= start:
                                yield candidate
            first_day = False
            day += timedelta(days=1)


_MONTH_NAMES = {name: i + 1 for i, name in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
_DAY_NAMES = {name: i for i, name in enumerate("SUN MON TUE WED THU FRI SAT".split())}


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: Mapping[str, int]
    #: Where ``*`` and an open-ended ``n/step`` stop (the day of week accepts 7 but ``*/2`` means 0,2,4,6).
    open_high: int | None = None


_SECOND = _Field("second", 0, 59, {})
_MINUTE = _Field("minute", 0, 59, {})
_HOUR = _Field("hour", 0, 23, {})
_DAY = _Field("day-of-month", 1, 31, {})
_MONTH = _Field("month", 1, 12, _MONTH_NAMES)
# 7 is Sunday too, as in every cron since Vixie's.
_WEEKDAY = _Field("day-of-week", 0, 7, _DAY_NAMES, open_high=6)


def _number(spec: _Field, token: str) -> int:
    value = spec.names.get(token.upper())
    if value is None:
        if not token.isdigit():
            raise ValueError(f"`{token}` is not a {spec.name} value")
        value = int(token)
    if not spec.low <= value <= spec.high:
        raise ValueError(f"{value} is out of range {spec.low}–{spec.high}")
    return value


def _item(spec: _Field, item: str) -> set[int]:
    """One comma-separated item: ``*``, ``n``, ``a-b``, each optionally ``/step``; ``n/step`` means ``n-max/step``."""
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
            raise ValueError(f"step `{step_text}` must be a whole number of at least 1")
        step = int(step_text)
    open_high = spec.high if spec.open_high is None else spec.open_high
    # A step past the field's span selects its first value only: `*/61` in minutes would fire hourly.
    span = open_high - spec.low + 1
    if slash and step > span:
        raise ValueError(f"step {step_text} is beyond the {spec.name} field's range (at most {span})")
    if base in ("*", "?"):
        low, high = spec.low, open_high
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _number(spec, first), _number(spec, last)
        if low > high:
            raise ValueError(f"range `{base}` runs backwards; write it as two ranges")
    else:
        low = _number(spec, base)
        high = open_high if slash else low
    return set(range(low, high + 1, step))


def _parse_field(spec: _Field, text: str) -> tuple[frozenset[int], bool]:
    """The values ``text`` allows, and whether it is a wildcard (starts with ``*`` or ``?``, as classic cron has it)."""
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise ValueError("has an empty item")
        values |= _item(spec, item)
    return frozenset(values), text[0] in "*?"


def _parse_weekdays(text: str) -> tuple[frozenset[int], dict[int, frozenset[int]], bool]:
    """Day-of-week values, the ``#n`` / ``L`` (last) qualifiers per weekday, and whether it is a wildcard."""
    plain: set[int] = set()
    nth: dict[int, set[int]] = {}
    for item in text.split(","):
        upper = item.upper()
        if "#" in item:
            day_text, _, n_text = item.partition("#")
            if not n_text.isdigit() or not 1 <= int(n_text) <= 5:
                raise ValueError(f"`{item}`: the occurrence after `#` must be 1–5")
            nth.setdefault(_number(_WEEKDAY, day_text) % 7, set()).add(int(n_text))
        elif len(upper) > 1 and (upper.startswith("L") or upper.endswith("L")):
            day_text = upper.strip("L")
            nth.setdefault(_number(_WEEKDAY, day_text) % 7, set()).add(0)  # 0 = the last one in the month
        elif not item:
            raise ValueError("has an empty item")
        else:
            plain |= {v % 7 for v in _item(_WEEKDAY, item)}
    if nth and plain:
        raise ValueError("cannot mix plain weekdays with `#n` or `L` qualifiers")
    weekdays = frozenset(plain | set(nth))
    return weekdays, {day: frozenset(ns) for day, ns in nth.items()}, text[0] in "*?"


@functools.lru_cache(maxsize=4096)
def parse_cron(text: str) -> CronExpr:
    """Parse and validate a cron expression; raises :class:`ScheduleError` on the ``schedule`` field.

    Sundial reads the fields itself rather than through ``croniter.expand``, whose expansion turns a
    one-value range into a wildcard (``0 0 1-1 * *`` would fire daily, ``5-5 * * * *`` every minute) and
    silently drops ``W``. The grammar is classic cron's: ``*``, values, ``a-b`` ranges, ``/step``, names
    for months and weekdays, 7 = Sunday, plus ``L`` and ``#n``.
    """
    if not isinstance(text, str) or not text.strip():
        raise ScheduleError("schedule", "is required for CRON jobs: a cron expression such as `*/5 * * * *`")
    normalized = " ".join(text.split())
    if normalized.startswith("@"):
        alias = _ALIASES.get(normalized.lower())
        if alias is None:
            raise ScheduleError("schedule", f"unknown alias `{normalized}`; known: {', '.join(_ALIASES)}")
        normalized = alias
    fields = normalized.split(" ")
    if len(fields) not in (5, 6):
        raise ScheduleError(
            "schedule",
            f"`{text}` has {len(fields)} field(s); a cron expression has 5 (minute hour day month weekday) "
            "or 6 with seconds first (second minute hour day month weekday)",
        )
    seconds_text = fields.pop(0) if len(fields) == 6 else "0"
    minute_text, hour_text, day_text, month_text, weekday_text = fields
    current = "second"
    try:
        seconds, _ = _parse_field(_SECOND, seconds_text)
        current = "minute"
        minutes, _ = _parse_field(_MINUTE, minute_text)
        current = "hour"
        hours, hour_star = _parse_field(_HOUR, hour_text)
        current = "day-of-month"
        day_items = day_text.upper().split(",")
        last_day = "L" in day_items
        other_days = ",".join(i for i in day_items if i != "L")
        days, days_star = _parse_field(_DAY, other_days) if other_days else (frozenset(), False)
        current = "month"
        months, _ = _parse_field(_MONTH, month_text)
        current = "day-of-week"
        weekdays, nth, weekdays_star = _parse_weekdays(weekday_text)
    except ValueError as exc:
        raise ScheduleError("schedule", f"`{text}`: {current} field: {exc}") from None
    return CronExpr(
        text=text,
        seconds=tuple(sorted(seconds)),
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        months=months,
        days=days,
        last_day=last_day,
        weekdays=weekdays,
        nth=nth,
        day_wildcard=(days_star and not last_day) or weekdays_star,
        real_time=hour_star or "/" in hour_text,
    )


def _next_cron(cron: CronExpr, tz: zoneinfo.ZoneInfo, after: datetime) -> datetime | None:
    """The first fire strictly after ``after`` under DESIGN invariant 6, or None within the search horizon.

    Candidates are walked in local wall-clock order. Each one's first instant grows with it (a skipped time
    maps to the end of its gap), so in fixed-hour mode the first candidate past ``after`` is the answer. In
    real-time mode a repeated time also fires at its second instant, which is later than the first instants
    of the next hour's candidates: the walk goes on until a first instant passes the best found so far.
    """
    wall = after.astimezone(tz)
    start = wall.replace(tzinfo=None)
    if cron.real_time:
        early = start.replace(tzinfo=tz, fold=0).utcoffset()
        late = start.replace(tzinfo=tz, fold=1).utcoffset()
        if early is not None and late is not None and early > late and wall.utcoffset() == early:
            # ``after`` is in the first pass of a repeated hour: the second pass of times *before* it on the
            # wall clock is still to come, so the walk starts one repeat earlier.
            start -= early - late
    best: datetime | None = None
    for local in cron.local_matches(start, start.year + CRON_SEARCH_YEARS):
        first, second, skipped = _instants(local, tz)
        if best is not None and first >= best:
            break
        if skipped and cron.real_time:
            continue
        for instant in (first, second) if cron.real_time else (first,):
            if instant is not None and instant > after and (best is None or instant < best):
                best = instant
        if best is not None and not cron.real_time:
            break
    return best


# --- the schedule ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """Everything that decides when a job fires. Instants are aware UTC datetimes at millisecond precision."""

    kind: Kind
    timezone: str = "UTC"
    cron: str | None = None
    interval_sec: int | None = None
    run_at: datetime | None = None
    run_list: tuple[datetime, ...] = ()
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = None
    jitter_sec: int = 0

    @property
    def recurring(self) -> bool:
        return self.kind in RECURRING


def spec_from_row(row: Mapping[str, Any]) -> ScheduleSpec:
    """The schedule of a ``jobs`` row (columns as the 0002 migration names them)."""
    kind = Kind(row["type"])
    run_at = row.get("run_at")
    if kind is Kind.DELAYED or (kind is Kind.ONE_SHOT and run_at is None):
        # A one-off's instant is its first (only) nominal fire, fixed at creation.
        run_at = row.get("next_nominal_at") or row.get("next_fire_at")
    return ScheduleSpec(
        kind=kind,
        timezone=row.get("timezone") or "UTC",
        cron=row.get("schedule"),
        interval_sec=row.get("interval_sec"),
        run_at=run_at,
        run_list=tuple(row.get("run_list") or ()),
        start_at=row.get("start_at"),
        end_at=row.get("end_at"),
        max_runs=row.get("max_runs"),
        jitter_sec=row.get("jitter_sec") or 0,
    )


def next_fire(spec: ScheduleSpec, after: datetime, runs: int = 0) -> datetime | None:
    """The nominal instant of the first occurrence strictly after ``after``; None when there is none.

    ``runs`` is how many runs the schedule has started so far (for ``max_runs``). Jitter is not applied:
    see :func:`fire_at`.
    """
    if spec.max_runs is not None and runs >= spec.max_runs:
        return None
    if spec.start_at is not None and after < spec.start_at:
        after = spec.start_at - _MS  # fires at or after start_at
    instant = _next_unbounded(spec, after)
    if instant is None or (spec.end_at is not None and instant > spec.end_at):
        return None
    return instant


def _next_unbounded(spec: ScheduleSpec, after: datetime) -> datetime | None:
    if spec.kind is Kind.CRON:
        if spec.cron is None:
            raise ScheduleError("schedule", "is required for CRON jobs")
        return _next_cron(parse_cron(spec.cron), parse_zone(spec.timezone), after)
    if spec.kind is Kind.INTERVAL:
        if spec.interval_sec is None or spec.interval_sec < 1 or spec.start_at is None:
            raise ScheduleError("intervalSec", "is required for INTERVAL jobs (with the anchor startAt)")
        anchor = to_ms(spec.start_at)
        period = spec.interval_sec * 1000
        elapsed = to_ms(after) - anchor
        steps = 0 if elapsed < 0 else elapsed // period + 1
        return from_ms(anchor + steps * period)
    if spec.kind is Kind.RUN_LIST:
        index = bisect.bisect_right(spec.run_list, after)
        return spec.run_list[index] if index < len(spec.run_list) else None
    # ONE_SHOT, DELAYED
    if spec.run_at is None:
        return None
    return spec.run_at if spec.run_at > after else None


def occurrences(spec: ScheduleSpec, after: datetime, runs: int = 0) -> Iterator[datetime]:
    """Successive nominal fires after ``after`` (each recomputed from the previous one, never accumulated)."""
    current: datetime | None = after
    while True:
        current = next_fire(spec, current, runs) if current is not None else None
        if current is None:
            return
        yield current
        runs += 1


def preview(spec: ScheduleSpec, after: datetime, count: int, runs: int = 0) -> list[datetime]:
    """The next ``count`` nominal fires after ``after`` (fewer if the schedule ends first)."""
    fires: list[datetime] = []
    for instant in occurrences(spec, after, runs):
        if len(fires) >= count:
            break
        fires.append(instant)
    return fires


def jitter(job_id: UUID, nominal: datetime, jitter_sec: int) -> timedelta:
    """This occurrence's delay in [0, jitter_sec) at millisecond steps, derived from job id and nominal time."""
    if jitter_sec <= 0:
        return timedelta(0)
    digest = hashlib.blake2b(job_id.bytes + to_ms(nominal).to_bytes(8, "big", signed=True), digest_size=8).digest()
    return timedelta(milliseconds=int.from_bytes(digest, "big") % (jitter_sec * 1000))


def fire_at(job_id: UUID, nominal: datetime, jitter_sec: int) -> datetime:
    """When the occurrence nominally at ``nominal`` actually fires."""
    if jitter_sec <= 0:  # the common case, without a zero timedelta added (the planner asks per occurrence)
        return nominal
    return nominal + jitter(job_id, nominal, jitter_sec)


def local_time(instant: datetime, zone: str) -> datetime:
    """``instant`` on the wall clock of ``zone`` (aware, with that zone's offset at the instant)."""
    return instant.astimezone(zoneinfo.ZoneInfo(zone))
