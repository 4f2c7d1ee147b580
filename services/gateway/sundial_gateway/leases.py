"""What a worker holds for one started attempt: its attempt token, and the terms the gateway bound into it.

An attempt token is ``<deadline ms>.<retry delay ms>.<mac>``: the attempt's deadline (epoch milliseconds, 0: none)
and the backoff its failure would schedule (the job's retry policy, drawn when it started), followed by the HMAC of
:func:`sundial_common.security.pool_tokens.attempt_token` over the execution, the attempt, the worker session and
both terms. So any gateway replica can check a heartbeat or a finish without reading anything (the key is shared),
the worker cannot move its deadline or its backoff, and a token is worth nothing for another attempt, execution or
session. The worker treats it as opaque.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sundial_common.security.auth import SymmetricKey
from sundial_common.security.pool_tokens import PoolGrant, attempt_token, attempt_token_valid

#: A worker session: chosen by the worker (a random id per process), sent with every call.
SESSION = r"^[A-Za-z0-9_-]{8,64}$"
_SESSION = re.compile(SESSION)
_TOKEN = re.compile(r"^(\d{1,15})\.(\d{1,12})\.([A-Za-z0-9_-]{43})$")


def worker_id(grant: PoolGrant, session: str) -> str:
    """The worker identity the attempts of ``session`` are started under (their ``worker_id``, their liveness keys'
    holder): the pool token's id and the session, so no other token's caller can finish or renew them."""
    if not _SESSION.match(session):
        raise ValueError("session must be 8 to 64 of A-Z, a-z, 0-9, `_` and `-`")
    return f"gw:{grant.token_id}:{session}"


@dataclass(frozen=True, slots=True)
class Terms:
    #: Epoch milliseconds past which the attempt has timed out; 0: no timeout.
    deadline_ms: int
    #: The backoff a FAILED or TIMED_OUT outcome schedules, if the execution has attempts left.
    retry_delay_ms: int


def _bound(worker: str, terms: Terms) -> str:
    return f"{worker}|{terms.deadline_ms}|{terms.retry_delay_ms}"


def issue(key: SymmetricKey, execution_id: str, attempt: int, worker: str, terms: Terms) -> str:
    mac = attempt_token(key, execution_id, attempt, _bound(worker, terms))
    return f"{terms.deadline_ms}.{terms.retry_delay_ms}.{mac}"


def check(keys: Sequence[SymmetricKey], token: str, execution_id: str, attempt: int, worker: str) -> Terms | None:
    """The terms of ``token`` if it is this attempt's, for this worker; else None."""
    match = _TOKEN.match(token)
    if match is None:
        return None
    terms = Terms(int(match[1]), int(match[2]))
    return terms if attempt_token_valid(keys, match[3], execution_id, attempt, _bound(worker, terms)) else None
