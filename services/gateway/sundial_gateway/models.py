"""The worker protocol's bodies: what a worker sends to the gateway and what it gets back (the OpenAPI document).

JSON with camelCase names, like the API. Every request names the worker's ``session`` (a random id it keeps for
its lifetime); every execution it reports on carries the ``attemptToken`` its pull returned.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator
from pydantic.alias_generators import to_camel

from sundial_gateway.leases import SESSION

MAX_BATCH = 1000


class _Request(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True, populate_by_name=True)


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


Session = Annotated[
    StrictStr,
    Field(
        pattern=SESSION,
        description="The worker's session: a random id (8-64 of A-Z, a-z, 0-9, `_`, `-`) it keeps while it runs. "
        "Heartbeats and finishes are accepted only from the session its executions were pulled by.",
        examples=["w-7f3a9c2e41"],
    ),
]


class WorkerInfo(_Request):
    """What the worker says of itself: the gateway announces it as one of the pool's live workers with these (the
    dispatcher sizes a pool's first queue by its live workers' free slots; the API and console list them)."""

    concurrency: Annotated[StrictInt, Field(ge=1, le=100_000)] = Field(description="Its handler slots.")
    free_slots: Annotated[StrictInt, Field(ge=0, le=100_000)] = Field(
        description="Slots free now (not running a handler), at most `concurrency`."
    )
    handlers: list[Annotated[StrictStr, Field(max_length=200)]] = Field(
        default_factory=list, max_length=1000, description="The handler names it serves."
    )
    version: Annotated[StrictStr, Field(max_length=100)] = Field("", description="Its SDK or program version.")

    @model_validator(mode="after")
    def _free_within_concurrency(self) -> WorkerInfo:
        if self.free_slots > self.concurrency:
            raise ValueError(f"freeSlots ({self.free_slots}) exceeds concurrency ({self.concurrency})")
        return self


class PullRequest(_Request):
    session: Session
    max: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        1, description="Most executions to start for this caller (its free handler slots)."
    )
    wait_ms: Annotated[StrictInt, Field(ge=0, le=120_000)] = Field(
        20_000, description="How long to wait for a first execution (long poll); 0: answer at once."
    )
    worker: WorkerInfo | None = Field(
        None,
        description="The worker's concurrency, free slots and handlers, announced as a live worker of the pool. "
        "Without it the worker is announced with `max` slots, all free, and no handler named.",
    )


class Lease(_View):
    """An execution started for this caller: run its handler, heartbeat it, finish it."""

    execution_id: str
    job_id: str
    tenant: str
    handler: str
    attempt: int = Field(description="1 for the first attempt, 2 for the first retry …")
    attempt_token: str = Field(description="Opaque; send it back with each heartbeat and the finish of this attempt.")
    payload: Any = Field(description="The job's payload (decrypted by the gateway).")
    scheduled_for: datetime
    timeout_sec: int | None = Field(description="The job's timeout; null: none.")
    deadline: datetime | None = Field(
        description="When the attempt times out: finish before it (a finish much later is recorded TIMED_OUT)."
    )
    previous_progress: Any = Field(description="The last progress an earlier attempt reported (resume from it).")
    trace_id: str | None = None
    traceparent: str | None = Field(
        None,
        description="W3C traceparent of the gateway's span for this attempt, in the execution's trace: send it with "
        "the handler's outgoing calls (or parent its spans on it) to continue the trace.",
    )


class PullResponse(_View):
    executions: list[Lease]


class Running(_Request):
    execution_id: StrictStr
    attempt: Annotated[StrictInt, Field(ge=1)]
    attempt_token: Annotated[StrictStr, Field(max_length=200)]
    progress: Any = Field(None, description="The attempt's progress so far (JSON; a retry starts from the last).")


class HeartbeatRequest(_Request):
    session: Session
    running: list[Running] = Field(max_length=MAX_BATCH, description="Every execution the worker is running.")


class HeartbeatAnswer(_View):
    execution_id: str
    renewed: bool = Field(
        description="False: the attempt is no longer this worker's (a stale token, or the sweeper gave it to "
        "another worker): stop its handler, its finish would be rejected."
    )
    cancel: bool = Field(description="True: stop the handler and finish the attempt (CANCELLED, or TIMED_OUT).")
    reason: str | None = Field(None, description="Why `renewed` is false or `cancel` true.")


class HeartbeatResponse(_View):
    running: list[HeartbeatAnswer]


class HandlerError(_Request):
    type: Annotated[StrictStr, Field(max_length=200)] = Field(examples=["ValueError"])
    message: Annotated[StrictStr, Field(max_length=10_000)] = ""
    traceback: StrictStr | None = Field(None, description="Kept to its last characters (the innermost frames).")


class Outcome(_Request):
    execution_id: StrictStr
    attempt: Annotated[StrictInt, Field(ge=1)]
    attempt_token: Annotated[StrictStr, Field(max_length=200)]
    state: Literal["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"]
    result: Any = Field(None, description="A SUCCEEDED attempt's result (JSON).")
    error: HandlerError | None = Field(None, description="A FAILED attempt's error.")
    log_tail: StrictStr | None = Field(None, description="The handler's last log lines (kept to the last characters).")


class FinishRequest(_Request):
    session: Session
    outcomes: list[Outcome] = Field(min_length=1, max_length=MAX_BATCH)


class FinishAnswer(_View):
    execution_id: str
    accepted: bool = Field(
        description="True: recorded (or had been, by an earlier copy of this finish). False: rejected — the attempt "
        "is not this worker's any more (stale token, cancelled, taken by the sweeper); nothing was written."
    )
    state: str | None = Field(None, description="The execution's state after the write (e.g. FAILED with a retry).")
    next_attempt_at: datetime | None = None
    reason: str | None = None


class FinishResponse(_View):
    outcomes: list[FinishAnswer]


class TokenResponse(_View):
    token: str = Field(description="A new pool token, the same registry entry, valid for its `ttlSec` from now.")
    expires_at: datetime
