"""HTTP targets: what an execution's request carries, how an answer becomes an outcome, and completion tokens.

An execution of a pool whose delivery is ``http`` is POSTed to the pool's target as JSON (:func:`request_body`):
``executionId``, ``attempt``, ``fenceToken``, ``scheduledFor``, ``jobId``, ``handler``, ``pool``, ``payload`` and,
when the deployment names where completions go, ``completionUrl`` and ``completionToken``. It is signed (Standard
Webhooks, ``webhook-id`` = ``<execution id>:<attempt>``) and carries ``Idempotency-Key: <execution id>:<attempt>``,
so a receiver dedupes a redelivered attempt and tells a retry (a higher attempt) from it.

:func:`verdict` turns the answer into what the attempt became: a 2xx succeeded (its body is the result); ``202``
accepted (the target finishes it later); 408, 409, 429, 5xx, a timeout or a connection error failed and may be
retried (a 429's or 503's ``Retry-After`` is the delay); any other answer failed for good.

**Completion tokens** are derived, not stored: an HMAC under the target's signing secret of the execution and the
attempt. The delivery worker makes one per accepted attempt without a write, and the API checks one with the
target's secret, in constant time. A token completes its own attempt only (a retry has another); a secret rotated
while an attempt is accepted makes its token void, and that attempt times out or is retried.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import orjson

from sundial_common.delivery.sender import Outcome
from sundial_common.delivery.signing import secret_key

#: The sealing purpose of a destination's secrets (the same as the notification subscriptions').
SEALED_SECRETS = "webhook_secrets"
IDEMPOTENCY_HEADER = "idempotency-key"
#: Statuses that fail an attempt but leave it to the retry policy (a 5xx too).
RETRYABLE = frozenset({408, 409, 429})

Verdict = Literal["succeeded", "accepted", "retry", "fail"]


def message_id(execution_id: UUID | str, attempt: int) -> str:
    """The ``webhook-id`` and ``Idempotency-Key`` of one attempt."""
    return f"{execution_id}:{attempt}"


def completion_token(secret: str, execution_id: UUID | str, attempt: int) -> str:
    """The token that completes this attempt: HMAC-SHA256 under ``secret``, base64url without padding."""
    digest = hmac.new(secret_key(secret), f"complete.{execution_id}.{attempt}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def check_completion_token(secrets: list[str], execution_id: UUID | str, attempt: int, token: str) -> bool:
    """Whether ``token`` completes this attempt under one of ``secrets`` (constant-time comparison)."""
    offered = token.encode()
    return any(hmac.compare_digest(completion_token(s, execution_id, attempt).encode(), offered) for s in secrets)


@dataclass(frozen=True, slots=True)
class TargetRequest:
    execution_id: UUID
    job_id: UUID
    attempt: int
    fence_token: int
    scheduled_for: datetime
    handler: str
    pool: str
    payload: Any
    completion_url: str | None = None
    completion_token: str | None = None


def request_body(request: TargetRequest) -> bytes:
    body: dict[str, Any] = {
        "executionId": str(request.execution_id),
        "jobId": str(request.job_id),
        "attempt": request.attempt,
        "fenceToken": request.fence_token,
        "scheduledFor": request.scheduled_for.isoformat(),
        "handler": request.handler,
        "pool": request.pool,
        "payload": request.payload,
    }
    if request.completion_url is not None:
        body["completionUrl"] = request.completion_url
        body["completionToken"] = request.completion_token
    return orjson.dumps(body)


def completion_url(base: str, pool: str, execution_id: UUID | str, attempt: int) -> str:
    """Where the target of ``pool`` completes an accepted attempt (``base``: the API's public URL)."""
    return f"{base.rstrip('/')}/v1/targets/{pool}/completions/{execution_id}/{attempt}"


def verdict(outcome: Outcome) -> Verdict:
    """What an attempt answered ``outcome`` became."""
    status = outcome.status
    if status == 202:
        return "accepted"
    if outcome.ok:
        return "succeeded"
    if status is None or status in RETRYABLE or status >= 500:
        return "retry"
    return "fail"


def result_of(outcome: Outcome) -> Any:
    """A 2xx answer's body as the result: its JSON when it is JSON, else its text; None when empty. A body cut
    at the response cap is kept as text, marked."""
    if not outcome.body:
        return None
    if not outcome.truncated:
        try:
            return orjson.loads(outcome.body)
        except orjson.JSONDecodeError:
            pass
    text = outcome.body.decode("utf-8", errors="replace")
    return {"body": text, "truncated": True} if outcome.truncated else text


def error_of(outcome: Outcome) -> str:
    """A failed answer as the attempt's error: the status and the start of the body, or what went wrong."""
    if outcome.status is None:
        return f"TargetUnreachable: {outcome.error or 'no answer'}"
    snippet = outcome.body[:500].decode("utf-8", errors="replace").strip()
    return f"TargetHTTP{outcome.status}: the target answered {outcome.status}" + (f": {snippet}" if snippet else "")
