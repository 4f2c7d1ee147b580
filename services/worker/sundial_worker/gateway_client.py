"""The gateway transport's HTTP side: calls to the worker gateway, moved to the next gateway when one fails, and the
pool token kept fresh.

``SUNDIAL_WORKER_GATEWAY`` lists the gateways (comma-separated URLs). A call goes to the current one; a connection
error, a timeout or a 5xx moves it to the next in turn and tries again (after a short pause once every gateway has
failed in a row), so a worker whose gateway dies carries on with another within a second or two — its executions'
attempt tokens are good at any gateway. A 4xx is the caller's to see (:class:`GatewayRefused`). A worker moved off
the first gateway it lists tries that one again after ``failback_sec``: each worker's first choice spreads them over
the gateways, and one restarted (or started after its workers) gets its workers back instead of leaving them all on
the others for good. A worker that has not reached any gateway yet waits up to ``start_grace_sec`` for its first one
to accept connections before moving on: started beside it (one pod, one compose file), it would otherwise move away
and back ``failback_sec`` later, and each move shifts the pool's partitions between the gateways' consumers.

The pool token comes from ``SUNDIAL_WORKER_TOKEN`` or the file ``SUNDIAL_WORKER_TOKEN_FILE`` (read again when a call
is refused as unauthorised: a deployment may rotate the file). It is refreshed (``POST /v1/worker/token``) once a
third of its lifetime is left.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("sundial.worker")

#: Pause after every gateway failed in a row, before trying them all again.
_ROUND_PAUSE_SEC = 0.2
#: How long a worker moved off its first gateway stays away before trying it again.
FAILBACK_SEC = 10.0
#: How long a worker that has not reached any gateway yet waits for its first one to accept connections.
START_GRACE_SEC = 5.0


class GatewayRefused(Exception):
    """The gateway answered 4xx: ``status`` and its ``detail``."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"gateway refused ({status}): {detail}")
        self.status = status
        self.detail = detail


def token_expiry(token: str) -> tuple[float, float]:
    """(``exp``, ``iat``) of a JWT, read without checking it (the gateway checks it; this only schedules refreshes)."""
    try:
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        return float(claims["exp"]), float(claims.get("iat", claims["exp"]))
    except (IndexError, KeyError, ValueError, TypeError):
        return float("inf"), 0.0


class GatewayClient:
    """Calls to the worker gateways: see the module docstring."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str | None = None,
        token_file: str | None = None,
        timeout_sec: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        failback_sec: float = FAILBACK_SEC,
        start_grace_sec: float = START_GRACE_SEC,
    ) -> None:
        if not urls:
            raise ValueError("SUNDIAL_WORKER_GATEWAY names no gateway URL")
        if not token and not token_file:
            raise ValueError(
                "the gateway transport needs a pool token: SUNDIAL_WORKER_TOKEN or SUNDIAL_WORKER_TOKEN_FILE"
            )
        self.urls = [u.rstrip("/") for u in urls]
        self._current = 0
        self._failback_sec = failback_sec
        #: When the worker last moved off its first gateway (monotonic; None: it is on it).
        self._left_first_at: float | None = None
        #: Until when a refused connection to the first gateway is tried again rather than moved on from (None: a
        #: gateway has answered, so failures move the worker at once).
        self._starting_until: float | None = time.monotonic() + start_grace_sec
        self._token_file = Path(token_file) if token_file else None
        self._token = token or self._read_file()
        self._timeout = timeout_sec
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_sec, connect=2.0), transport=transport)
        self._refreshing: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return self.urls[self._current]

    def _read_file(self) -> str:
        assert self._token_file is not None
        try:
            token = self._token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"SUNDIAL_WORKER_TOKEN_FILE {self._token_file}: {exc.strerror}") from exc
        if not token:
            raise ValueError(f"SUNDIAL_WORKER_TOKEN_FILE {self._token_file} is empty")
        return token

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
        await self._http.aclose()

    async def call(
        self, path: str, body: dict[str, Any], *, wait_sec: float = 0.0, give_up_at: float | None = None
    ) -> Any:
        """POST ``body`` to ``path`` at the current gateway, moving on to the next while they fail; ``wait_sec`` is
        how long the gateway may hold the call (a long poll). Retries until ``give_up_at`` (monotonic; None: for
        ever) and then raises the last error."""
        self._maybe_refresh()
        self._maybe_fail_back()
        failures = 0
        reread = False
        while True:
            url = self.url
            try:
                response = await self._http.post(
                    f"{url}{path}",
                    json=body,
                    headers={"Authorization": f"Bearer {self._token}"},
                    timeout=httpx.Timeout(self._timeout + wait_sec, connect=2.0),
                )
            except httpx.TransportError as exc:
                if self._starting(exc):
                    await asyncio.sleep(_ROUND_PAUSE_SEC)
                    continue
                error: Exception = exc
            else:
                self._starting_until = None
                if response.status_code < 400:
                    return response.json()
                detail = _detail(response)
                if response.status_code == 401 and self._token_file is not None and not reread:
                    reread = True  # the file may hold a newer token (rotated by the deployment)
                    self._token = self._read_file()
                    continue
                if response.status_code == 429:
                    await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                    continue
                if response.status_code < 500:
                    raise GatewayRefused(response.status_code, detail)
                error = GatewayRefused(response.status_code, detail)
            failures += 1
            if self.url == url:  # not moved on already by another call that failed there at the same time
                self._current = (self._current + 1) % len(self.urls)
                self._left_first_at = time.monotonic() if self._current else None
                log.warning("gateway %s failed (%s); trying %s", url, error, self.url)
            if give_up_at is not None and time.monotonic() >= give_up_at:
                raise error
            if failures % len(self.urls) == 0:
                await asyncio.sleep(_ROUND_PAUSE_SEC)

    def _starting(self, exc: httpx.TransportError) -> bool:
        """Whether ``exc`` is the first gateway not accepting connections yet, within the start grace."""
        if self._starting_until is None or time.monotonic() >= self._starting_until:
            self._starting_until = None
            return False
        return isinstance(exc, httpx.ConnectError) and self._current == 0

    def _maybe_fail_back(self) -> None:
        if self._left_first_at is not None and time.monotonic() - self._left_first_at >= self._failback_sec:
            self._current = 0
            self._left_first_at = None
            log.info("trying the first gateway %s again", self.url)

    def _maybe_refresh(self) -> None:
        expires, issued = token_expiry(self._token)
        left = expires - time.time()
        if left > (expires - issued) / 3 or (self._refreshing is not None and not self._refreshing.done()):
            return
        self._refreshing = asyncio.create_task(self._refresh(), name="sundial-worker-token-refresh")

    async def _refresh(self) -> None:
        try:
            answer = await self.call("/v1/worker/token", {}, give_up_at=time.monotonic() + 30)
        except (GatewayRefused, httpx.HTTPError) as exc:
            log.error("refreshing the pool token failed: %s", exc)
            return
        self._token = answer["token"]
        log.info("pool token refreshed; it expires at %s", answer["expiresAt"])


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:200]
