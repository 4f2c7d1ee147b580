"""The delivery worker: a worker whose every handler POSTs the execution to its pool's HTTP target.

``sundial worker --http-target POOL`` serves a pool whose ``delivery`` is ``http`` with the ordinary worker runtime
(the same consumer group, start and finish compare-and-swaps, liveness keys, timeouts, cancels and retries), and one
handler for every handler name: :class:`TargetDelivery`. It reads the pool's target (through a cache of a couple
of seconds, so an owner's change applies within that), opens its secret with the owning tenant's data key, and
sends one signed POST through the delivery module (:mod:`sundial_common.delivery`: resolve once, the address
policy, timeouts, the response cap). The answer becomes the attempt's outcome
(:func:`sundial_common.delivery.targets.verdict`):

- 2xx: SUCCEEDED, the body is the result (capped at ``SUNDIAL_DELIVERY_MAX_RESPONSE_BYTES``);
- 202: accepted — the attempt stays RUNNING, its liveness held for the job's ``timeoutSec`` (or
  ``SUNDIAL_WORKER_TARGET_HOLD_SEC``), for the target to finish through the completion URL the request carried;
- 408, 409, 429, 5xx, a timeout, a connection error: FAILED and retried by the job's policy, after the answer's
  ``Retry-After`` instead when a 429 or 503 gives one;
- any other 4xx: FAILED and DEAD at once (the same request would be refused again);
- no target set, or an address the policy refuses: FAILED, retried by the policy (an owner or admin can fix it).

The job's ``timeoutSec`` bounds the request too: the runtime interrupts the handler then, as any handler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sundial_common.delivery.sender import OutboundRequest, Sender, SenderConfig
from sundial_common.delivery.targets import (
    IDEMPOTENCY_HEADER,
    SEALED_SECRETS,
    TargetRequest,
    completion_token,
    completion_url,
    error_of,
    message_id,
    request_body,
    result_of,
    verdict,
)
from sundial_common.runtime.settings import CommonSettings, DeliverySettings
from sundial_common.security.encryption import Keyring, open_keyring
from sundial_common.stores import Stores
from sundial_common.stores.pool_targets import PoolTarget

from sundial_worker.sdk import Context, HandlerRegistry, HandlerSpec, Worker
from sundial_worker.verdicts import Accepted, NoRetry, RetryAfter

log = logging.getLogger("sundial.worker.target")

#: How long a read of the pool's target is trusted.
TARGET_CACHE_SEC = 2.0
#: The handler name the delivery worker announces (it serves every name).
ANY_HANDLER = "*"


class TargetMissing(Exception):
    """The pool has no target yet: the attempt fails and is retried by the policy."""


class TargetDelivery:
    """The one handler of a delivery worker: POST the execution to the pool's target, and say what came of it."""

    def __init__(
        self,
        settings: CommonSettings,
        delivery: DeliverySettings,
        *,
        completion_base_url: str | None,
        hold_sec: float,
        sender: Sender | None = None,
    ) -> None:
        self.settings = settings
        self.completion_base_url = completion_base_url
        self.hold_sec = hold_sec
        self._sender = sender or Sender(SenderConfig.from_settings(delivery, settings.env))
        self._stores: Stores | None = None
        self._keyring: Keyring | None = None
        self._opening = asyncio.Lock()
        #: Per pool: when it was read, its target and the target's opened signing secrets (None: no target yet).
        self._targets: dict[str, tuple[float, PoolTarget | None, list[str]]] = {}

    async def _open(self) -> tuple[Stores, Keyring]:
        async with self._opening:
            if self._stores is None or self._keyring is None:
                stores = await Stores.connect(self.settings.database_url, min_size=1, max_size=2)
                self._keyring = await open_keyring(self.settings, stores.keys)
                self._stores = stores
            return self._stores, self._keyring

    async def close(self) -> None:
        await self._sender.close()
        if self._stores is not None:
            await self._stores.close()
            self._stores = None

    async def target(self, pool: str) -> tuple[PoolTarget | None, list[str]]:
        """The pool's target and its signing secrets, opened once per read rather than once per execution."""
        cached = self._targets.get(pool)
        now = time.monotonic()
        if cached is not None and now - cached[0] < TARGET_CACHE_SEC:
            return cached[1], cached[2]
        stores, keyring = await self._open()
        target = await stores.pool_targets.get_target(pool)
        secrets: list[str] = []
        if target is not None:
            secrets = (await keyring.cipher(target.tenant_id)).open_json(target.sealed_secrets, SEALED_SECRETS)
        self._targets[pool] = (now, target, secrets)
        return target, secrets

    async def __call__(self, ctx: Context, payload: Any) -> Any:
        target, secrets = await self.target(ctx.pool)
        if target is None:
            raise TargetMissing(f"pool {ctx.pool!r} has no HTTP target yet (PUT /v1/pools/{ctx.pool}/target)")
        ident = message_id(ctx.execution_id, ctx.attempt)
        completion = None
        if self.completion_base_url:
            completion = completion_url(self.completion_base_url, ctx.pool, ctx.execution_id, ctx.attempt)
        body = request_body(
            TargetRequest(
                execution_id=ctx.execution_id,
                job_id=ctx.job_id,
                attempt=ctx.attempt,
                fence_token=ctx.fence_token,
                scheduled_for=ctx.scheduled_for,
                handler=ctx.handler,
                pool=ctx.pool,
                payload=payload,
                completion_url=completion,
                completion_token=completion_token(secrets[0], ctx.execution_id, ctx.attempt) if completion else None,
            )
        )
        outcome = await self._sender.send(
            OutboundRequest(
                url=target.url_for(ctx.handler),
                body=body,
                msg_id=ident,
                secrets=tuple(secrets),
                purpose="target",
                headers={IDEMPOTENCY_HEADER: ident},
            )
        )
        match verdict(outcome):
            case "succeeded":
                return result_of(outcome)
            case "accepted":
                if completion is None:
                    # Nobody could ever finish it: say so rather than leave it RUNNING until it times out.
                    raise NoRetry(
                        "TargetAccepted: the target answered 202, but no completion URL is configured "
                        "(SUNDIAL_WORKER_TARGET_COMPLETION_URL)"
                    )
                raise Accepted(ctx.timeout_sec or self.hold_sec, f"target accepted attempt {ctx.attempt} (202)")
            case "retry":
                if outcome.retry_after_sec is not None and outcome.status in (429, 503):
                    raise RetryAfter(outcome.retry_after_sec, error_of(outcome))
                raise RuntimeError(error_of(outcome))
            case _:
                raise NoRetry(error_of(outcome))


class _AnyHandler(HandlerRegistry):
    """A registry that serves every handler name with one function."""

    def __init__(self, pool: str, func: TargetDelivery) -> None:
        super().__init__(pool)
        self.register(ANY_HANDLER, func)
        self._spec = HandlerSpec(ANY_HANDLER, func, is_async=True)

    def get(self, name: str) -> HandlerSpec | None:
        return self._spec


def delivery_worker(pool: str, handler: TargetDelivery, *, concurrency: int) -> Worker:
    """A :class:`Worker` for ``pool`` whose every handler is ``handler``."""
    worker = Worker(pool, concurrency=concurrency)
    worker.registry = _AnyHandler(pool, handler)
    return worker
