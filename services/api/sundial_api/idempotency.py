"""``Idempotency-Key`` on ``POST /v1/jobs`` (and ``/v1/jobs:batch``): a retried create registers its jobs once,
and answers as the first request did.

A client that lost the answer to a create (a timeout, a 503 while Postgres restarted, its own crash) sends
the same request again with the same key. Keys are scoped per tenant and kept 24 hours
(``SUNDIAL_IDEMPOTENCY_TTL_SEC``):

* same key, same body, first request done → the first answer again, byte for byte (status, ``Location``,
  ``ETag``, body), with ``Idempotent-Replayed: true``;
* same key, another body → 422 naming ``Idempotency-Key``;
* same key while the first request is still running → 409 with ``Retry-After`` (never a second job:
  concurrent duplicates race for one row, and exactly one wins).

How. The request first *claims* the key: one ``INSERT … ON CONFLICT`` writes an IN_FLIGHT row with the body's
hash and a claim token, locked for ``SUNDIAL_IDEMPOTENCY_LOCK_SEC``. The job is then inserted **in the same
transaction** that completes the key with the answer (only the claim's token may complete it). So a job
exists if and only if its key answers with it: a crash or a Postgres restart anywhere in between leaves
either both or neither. A claim whose request died (the API crashed, the database went away) is taken over
by a retry of the same body once its lock has passed; if the first request was merely slow and comes back,
its completion finds another token and its transaction — job included — rolls back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel
from starlette.responses import Response
from sundial_common.security.auth import Principal
from sundial_common.security.encryption import RESPONSE, TenantCipher
from sundial_common.stores.dependencies import Edge
from sundial_common.stores.idempotency import IdempotentResponse
from sundial_common.stores.types import Record

from sundial_api.models.jobs import render_job
from sundial_api.problems import ProblemError, field_error
from sundial_api.responses import dumps
from sundial_api.state import ApiState

log = logging.getLogger("sundial.api")

HEADER = "Idempotency-Key"
#: Visible ASCII (a UUID, a hash, "order-42-create"), as the IETF draft and Stripe accept.
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
_CLAIM_ROUNDS = 3
_T = TypeVar("_T")


def invalid_key(message: str) -> ProblemError:
    return ProblemError(422, f"`{HEADER}` {message}", errors=[field_error(HEADER, message)])


def valid_key(key: str) -> bool:
    return _KEY.match(key) is not None


def request_hash(body: BaseModel) -> bytes:
    """The body as the client sent it (set fields only, keys sorted): equal requests hash equal."""
    try:
        canonical = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
    except ValueError:  # nested past pydantic's serialization depth (a batch item refused later, by itself)
        fields = type(body).model_fields
        text = canonical_json({fields[name].alias or name: getattr(body, name) for name in body.model_fields_set})
        return hashlib.sha256(text).digest()
    try:
        text = orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        # Valid JSON orjson cannot write (an integer beyond 64 bits, a lone surrogate, deep nesting) in a batch
        # item that is refused later with a 422 naming it: hashed all the same, never a 500 (found by fuzzing).
        text = canonical_json(canonical)
    return hashlib.sha256(text).digest()


def canonical_json(value: Any) -> bytes:
    """``value`` as JSON with sorted keys, ASCII only, written without recursion: any depth the parser accepted
    (``json.dumps`` recurses, and stops at Python's recursion limit)."""
    out: list[str] = []
    stack: list[Any] = [value]
    close = object()  # marks where a container's closing bracket goes
    while stack:
        item = stack.pop()
        if item is close:
            out.append(stack.pop())
        elif isinstance(item, _Text):
            out.append(item.text)
        elif isinstance(item, dict):
            pairs = sorted(item.items(), key=lambda kv: str(kv[0]))
            stack += ["}", close]
            for i, (key, child) in reversed(list(enumerate(pairs))):
                stack += [child, _Text(("," if i else "") + json.dumps(str(key)) + ":")]
            out.append("{")
        elif isinstance(item, list | tuple):
            stack += ["]", close]
            for i, child in reversed(list(enumerate(item))):
                stack += [child, _Text("," if i else "")]
            out.append("[")
        elif isinstance(item, BaseModel):
            stack.append(item.model_dump(mode="json", by_alias=True, exclude_unset=True))
        else:
            out.append(json.dumps(item if isinstance(item, str | int | float | bool | None) else str(item)))
    return "".join(out).encode()


@dataclasses.dataclass(frozen=True, slots=True)
class _Text:
    """Text :func:`canonical_json` writes as it is (a separator or a key)."""

    text: str


def _replay(row: Mapping[str, Any], cipher: TenantCipher) -> Response:
    headers = {**(row["headers"] or {}), "Idempotent-Replayed": "true"}
    body = cipher.open_bytes(bytes(row["body"]), RESPONSE)
    return Response(body, status_code=row["status_code"], headers=headers, media_type="application/json")


def _created(row: Record, cipher: TenantCipher, warnings: Sequence[Mapping[str, str]] = ()) -> IdempotentResponse:
    """What ``POST /v1/jobs`` answers for a new job (the same bytes ``jobs.create_job`` sends, its warnings
    included), kept sealed: it holds the payload."""
    view = render_job(row, cipher)
    if warnings:
        view["warnings"] = list(warnings)
    return IdempotentResponse(
        status_code=201,
        headers={"Location": f"/v1/jobs/{row['id']}", "ETag": f'"{row["version"]}"'},
        body=cipher.seal_bytes(dumps(view), RESPONSE),
        resource_id=row["id"],
    )


async def _claim(state: ApiState, tenant: str, key: str, digest: bytes, cipher: TenantCipher) -> uuid.UUID | Response:
    """Take the key for this request (its claim token), or the answer a request holding it calls for."""
    settings = state.settings
    for _ in range(_CLAIM_ROUNDS):
        token = uuid.uuid4()
        if await state.stores.idempotency.claim_idempotency_key(
            tenant, key, digest, token, settings.idempotency_lock_sec, settings.idempotency_ttl_sec
        ):
            return token
        row = await state.stores.idempotency.get_idempotency_key(tenant, key)
        if row is None:
            continue  # it expired between the two statements: claim it again
        if bytes(row["request_hash"]) != digest:
            raise invalid_key("was already used with a different request body; use a new key for a new request")
        if row["state"] == "DONE":
            return _replay(row, cipher)
        if row["lock_expired"]:
            continue  # its request died: the next claim takes it over
        raise ProblemError(
            409,
            "a request with this Idempotency-Key is still being processed; retry shortly",
            headers={"Retry-After": "1"},
            slug="idempotency-key-in-use",
        )
    raise ProblemError(409, "the Idempotency-Key kept changing hands; retry shortly", headers={"Retry-After": "1"})


async def create_job_once(
    state: ApiState,
    principal: Principal,
    key: str,
    body: BaseModel,
    values: dict[str, Any],
    cipher: TenantCipher,
    max_active_jobs: int | None = None,
    parents: Sequence[Edge] = (),
    warnings: Sequence[Mapping[str, str]] = (),
) -> Record | Response:
    """Insert the job described by ``values`` unless ``key`` already did: the new row, or the answer to replay
    (``warnings``: the create's, kept in that answer)."""

    async def insert(token: uuid.UUID) -> Record | None:
        done = await state.stores.idempotency.insert_job_idempotent(
            values,
            principal.subject,
            key=key,
            token=token,
            respond=lambda row: _created(row, cipher, warnings),
            max_active_jobs=max_active_jobs,
            parents=parents,
        )
        return None if done is None else done[0]

    return await _once(state, principal, key, body, insert, cipher)


async def create_jobs_once(
    state: ApiState,
    principal: Principal,
    key: str,
    body: BaseModel,
    jobs: Sequence[dict[str, Any]],
    answer: Callable[[list[Record]], dict[str, Any]],
    cipher: TenantCipher,
    max_active_jobs: int | None = None,
) -> list[Record] | Response:
    """``POST /v1/jobs:batch`` with a key: insert ``jobs`` unless ``key`` already did; ``answer(rows)`` is the
    200 body that will be replayed. The new rows, or the answer to replay."""

    def respond(rows: list[Record]) -> IdempotentResponse:
        sealed = cipher.seal_bytes(dumps(answer(rows)), RESPONSE)  # the jobs' payloads are in it
        return IdempotentResponse(status_code=200, headers={}, body=sealed, resource_id=None)

    async def insert(token: uuid.UUID) -> list[Record] | None:
        done = await state.stores.idempotency.insert_jobs_idempotent(
            jobs,
            principal.subject,
            tenant_id=principal.tenant,
            key=key,
            token=token,
            respond=respond,
            max_active_jobs=max_active_jobs,
        )
        return None if done is None else done[0]

    return await _once(state, principal, key, body, insert, cipher)


async def _once(
    state: ApiState,
    principal: Principal,
    key: str,
    body: BaseModel,
    insert: Callable[[uuid.UUID], Awaitable[_T | None]],
    cipher: TenantCipher,
) -> _T | Response:
    if not valid_key(key):
        raise invalid_key("must be 1 to 255 visible ASCII characters (a UUID is a good choice)")
    digest = request_hash(body)
    for _ in range(_CLAIM_ROUNDS):
        claimed = await _claim(state, principal.tenant, key, digest, cipher)
        if isinstance(claimed, Response):
            return claimed
        try:
            created = await insert(claimed)
        except Exception:
            # Nothing was created (the transaction rolled back): free the key for an immediate retry. If
            # Postgres itself is gone this fails too, and the claim's lock runs out instead.
            with contextlib.suppress(Exception):
                await state.stores.idempotency.release_idempotency_key(principal.tenant, key, claimed)
            raise
        if created is not None:
            return created
        # Our claim was taken over while we ran (we outlived its lock): what holds the key now decides.
        log.warning("idempotency claim of a create was taken over; what it created was rolled back")
    raise ProblemError(409, "the Idempotency-Key kept changing hands; retry shortly", headers={"Retry-After": "1"})
