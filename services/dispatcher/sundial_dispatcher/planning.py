"""What to do with one due occurrence of a job: the catch-up and overlap policies, as a pure function.

The dispatcher calls :func:`decide` inside its transaction for each locked job whose schedule is due. It
gets the occurrence the job is at, the time, and the job's executions still open, and answers which
occurrences run, which are recorded as SKIPPED, which open executions to cancel, how many fires were
missed and where the schedule goes next — or that the job must wait (BUFFER_ONE).

**Catch-up** (after downtime: the dispatcher, or the whole system, was not running when fires came due).
Every occurrence whose fire time has passed is due now. Those late by at most ``catchup_window_sec`` are
ordinary late fires and each runs. Those later than that were *missed*, and the policy decides:

* ``FIRE_ONCE`` (default): one run stands for all of them (the most recent) — none if a timely one runs;
* ``FIRE_ALL``: each runs, up to ``fire_all_cap`` per pass;
* ``SKIP``: none runs.

Every missed occurrence without a run of its own is counted in the job's ``missedFires``.

**Overlap** (the job's previous execution is still PENDING or RUNNING, or several occurrences run at once):

* ``ALLOW`` (default): everything runs;
* ``SKIP``: the occurrence is recorded as a SKIPPED execution; of several due together, the first runs;
* ``BUFFER_ONE``: the occurrence waits until the open execution ends, then runs (late); occurrences that
  came due meanwhile are recorded as SKIPPED — the buffer holds one. A wait longer than
  ``catchup_window_sec`` makes the buffered occurrence a missed one (the catch-up policy cannot tell a
  long overlap from downtime), so such jobs want a window longer than their longest run;
* ``CANCEL_RUNNING``: the open executions are cancelled and the newest occurrence runs; older ones due
  together are recorded as SKIPPED (they would be cancelled at once).

Every next occurrence is recomputed from the expression (:func:`sundial_common.domain.schedules.next_fire`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from sundial_common.domain.schedules import ScheduleSpec, fire_at, next_fire


class Overlap(enum.StrEnum):
    ALLOW = "ALLOW"
    SKIP = "SKIP"
    BUFFER_ONE = "BUFFER_ONE"
    CANCEL_RUNNING = "CANCEL_RUNNING"


class Catchup(enum.StrEnum):
    FIRE_ONCE = "FIRE_ONCE"
    FIRE_ALL = "FIRE_ALL"
    SKIP = "SKIP"


#: How many due occurrences of one job one pass looks at (each costs a next-fire computation inside the
#: dispatch transaction). Beyond it — an every-second job after days of downtime — the schedule jumps to
#: its next occurrence after now, and the occurrences jumped over are neither run nor counted.
ENUMERATION_CAP = 100_000


@dataclass(frozen=True)
class Policies:
    overlap: Overlap = Overlap.ALLOW
    catchup: Catchup = Catchup.FIRE_ONCE
    catchup_window_sec: int = 60
    #: FIRE_ALL runs at most this many missed occurrences per pass; the rest count as missed.
    fire_all_cap: int = 100


@dataclass
class Decision:
    """The outcome for one job. Nominal instants throughout; the caller applies jitter."""

    #: Occurrences that get a PENDING execution, oldest first.
    runs: list[datetime] = field(default_factory=list)
    #: Occurrences recorded as SKIPPED, with the reason.
    skipped: list[tuple[datetime, str]] = field(default_factory=list)
    #: Open executions to cancel (CANCEL_RUNNING).
    cancel: list[UUID] = field(default_factory=list)
    #: BUFFER_ONE with an execution still open: change nothing and look again shortly.
    hold: bool = False
    #: Where the schedule goes next (None: it is over).
    next_nominal: datetime | None = None
    #: Occurrences missed beyond the catch-up window without a run of their own.
    missed: int = 0


def decide(
    spec: ScheduleSpec,
    job_id: UUID,
    due: datetime,
    now: datetime,
    *,
    runs_so_far: int,
    policies: Policies,
    open_executions: Sequence[UUID] = (),
) -> Decision:
    """Decide the due occurrence ``due`` (nominal) of a job at ``now``; see the module docstring."""
    if open_executions and policies.overlap is Overlap.BUFFER_ONE:
        return Decision(hold=True, next_nominal=due)

    # Every occurrence whose fire time has passed, from the one the job is at.
    due_now = [due]
    following = next_fire(spec, due)
    while following is not None and fire_at(job_id, following, spec.jitter_sec) <= now:
        if len(due_now) >= ENUMERATION_CAP:
            following = next_fire(spec, now)
            break
        due_now.append(following)
        following = next_fire(spec, following)
    # Fired before this instant = beyond the catch-up window (each fire time computed once).
    cutoff = now - timedelta(seconds=policies.catchup_window_sec)
    late: list[datetime] = []
    timely: list[datetime] = []
    for o in due_now:
        (late if fire_at(job_id, o, spec.jitter_sec) < cutoff else timely).append(o)

    decision = Decision(next_nominal=following)
    candidates: list[datetime] = []
    if late:
        if policies.catchup is Catchup.FIRE_ALL:
            candidates = late[: policies.fire_all_cap]
            decision.missed += len(late) - len(candidates)
        elif policies.catchup is Catchup.FIRE_ONCE and not timely:
            candidates = [late[-1]]
            decision.missed += len(late) - 1
        else:
            decision.missed += len(late)
    candidates += timely

    if spec.max_runs is not None:
        allowed = max(0, spec.max_runs - runs_so_far)
        candidates = candidates[:allowed]

    _apply_overlap(decision, candidates, policies.overlap, open_executions)

    if spec.max_runs is not None and runs_so_far + len(decision.runs) >= spec.max_runs:
        decision.next_nominal = None
    return decision


def _apply_overlap(
    decision: Decision, candidates: list[datetime], overlap: Overlap, open_executions: Sequence[UUID]
) -> None:
    if not candidates:
        return
    if overlap is Overlap.ALLOW:
        decision.runs = candidates
    elif overlap is Overlap.SKIP and open_executions:
        reason = f"skipped: execution {open_executions[-1]} of this job was still open (overlapPolicy SKIP)"
        decision.skipped = [(c, reason) for c in candidates]
    elif overlap in (Overlap.SKIP, Overlap.BUFFER_ONE):
        decision.runs = candidates[:1]
        reason = f"skipped: the occurrence of {candidates[0].isoformat()} was running (overlapPolicy {overlap})"
        decision.skipped = [(c, reason) for c in candidates[1:]]
    else:  # CANCEL_RUNNING
        decision.cancel = list(open_executions)
        decision.runs = candidates[-1:]
        newest = candidates[-1].isoformat()
        reason = f"skipped: superseded by the occurrence of {newest} (overlapPolicy CANCEL_RUNNING)"
        decision.skipped = [(c, reason) for c in candidates[:-1]]
