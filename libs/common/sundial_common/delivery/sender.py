"""The HTTP client every outbound request goes through: signed, bounded, and only to allowed addresses.

One :class:`Sender` per process. A request's URL is checked (:func:`check_url`), its host resolved once by
the injected :class:`Resolver`, the addresses checked by :func:`~.address_policy.check_addresses`, and the
connection made to that very address: the URL sent to the transport carries the address, the ``Host``
header and the TLS server name (SNI and certificate check) carry the name. Nothing else is trusted from
the environment: proxy variables are ignored (``trust_env=False``; a proxy would resolve the name again),
redirects are returned as responses, not followed (a redirect to ``169.254.169.254`` would skip the check).

Every attempt has a connect timeout and a total deadline; the response body is read up to
``max_response_bytes`` and the rest dropped. :meth:`Sender.deliver` retries transient failures (timeouts,
connection errors, 408, 409, 429, 5xx) with the caller's :class:`~sundial_common.domain.retry_policy.RetryPolicy`,
waiting what ``Retry-After`` asks on 429 and 503 when it asks for no more than the policy's maximum delay.
Every attempt is traced and counted; neither the trace nor the log carries a secret or the body.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Literal, Protocol

import httpx
from prometheus_client import Counter, Histogram

from sundial_common.delivery.address_policy import (
    AddressPolicy,
    AddressRefused,
    IPAddress,
    IPNetwork,
    check_addresses,
)
from sundial_common.delivery.signing import signed_headers
from sundial_common.domain.retry_policy import RetryPolicy
from sundial_common.observability.metrics import REGISTRY
from sundial_common.observability.tracing import tracer
from sundial_common.runtime.clock import Clock, SystemClock
from sundial_common.runtime.settings import DeliverySettings

log = logging.getLogger(__name__)

Purpose = Literal["notification", "target", "test"]
#: Statuses worth another attempt: the receiver is overloaded, restarting, or the request timed out there.
RETRYABLE_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))

DELIVERIES = Counter(
    "sundial_delivery_attempts",
    "Outbound HTTP requests sent (or refused before sending), by purpose and outcome.",
    ["purpose", "outcome"],
    registry=REGISTRY,
)
DELIVERY_SECONDS = Histogram(
    "sundial_delivery_seconds",
    "Duration of outbound HTTP requests, from resolution to the end of the response body.",
    ["purpose"],
    registry=REGISTRY,
)


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every address ``host`` resolves to, in the order a connection would try them."""
        ...


class SystemResolver:
    """The operating system's resolver (``getaddrinfo``), without blocking the event loop."""

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        found: list[IPAddress] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in found:
                found.append(address)
        return found


class CachingResolver:
    """``resolver``'s answers kept ``ttl_sec`` (per host and port), so a busy destination is not resolved per request.

    Only the resolution is kept: every request still checks the addresses against its own policy and connects
    to the address it checked. Failures are not kept; at most ``max_entries`` names are.
    """

    def __init__(self, resolver: Resolver, clock: Clock, ttl_sec: float, max_entries: int = 1024) -> None:
        self._resolver = resolver
        self._clock = clock
        self._ttl_sec = ttl_sec
        self._max_entries = max_entries
        self._answers: dict[tuple[str, int], tuple[float, list[IPAddress]]] = {}

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        now = self._clock.monotonic()
        kept = self._answers.get((host, port))
        if kept is not None and kept[0] > now:
            return kept[1]
        found = await self._resolver.resolve(host, port)
        if len(self._answers) >= self._max_entries:
            self._answers = {key: value for key, value in self._answers.items() if value[0] > now}
            if len(self._answers) >= self._max_entries:
                self._answers.clear()
        self._answers[(host, port)] = (now + self._ttl_sec, found)
        return found


class URLRefused(ValueError):
    """A destination URL is malformed or not allowed (plain HTTP outside development, credentials in it)."""


@functools.lru_cache(maxsize=1024)
def check_url(url: str, allow_http: bool) -> httpx.URL:
    """``url`` parsed, when Sundial may send to it; otherwise :class:`URLRefused` saying why.

    Only ``https`` outside development (``allow_http``), a host, no user name or password in the URL (the
    signature authenticates Sundial; credentials in a URL end up in logs), no control characters. Answers are
    kept (a refusal is not): a delivery worker sends to the same few URLs all day.
    """
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise URLRefused("the URL contains control characters")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise URLRefused(f"not a URL: {exc}") from None
    schemes = ("https", "http") if allow_http else ("https",)
    if parsed.scheme not in schemes:
        raise URLRefused("the URL must start with https://" + (" or http://" if allow_http else ""))
    if not parsed.host:
        raise URLRefused("the URL has no host")
    if parsed.userinfo:
        raise URLRefused("the URL may not carry a user name or password")
    return parsed


def check_header_values(headers: Mapping[str, str]) -> None:
    """Refuse CR, LF and NUL in header names and values: they would split one header into several."""
    for name, value in headers.items():
        if any(ch in name or ch in value for ch in "\r\n\0"):
            raise ValueError(f"header {name!r} contains a line break or NUL")


@dataclass(frozen=True)
class SenderConfig:
    """How outbound requests are bounded.

    ``connect_timeout_sec``: to establish the connection (TLS included); ``total_timeout_sec``: one attempt,
    from resolution to the last byte read; ``max_response_bytes``: the response body kept (the rest is
    dropped); ``allow_http``: plain-HTTP URLs (development only); ``ca_bundle``: a PEM file of the CAs
    trusted for HTTPS instead of the system's; ``policy``: the networks administrators allowed everywhere.
    """

    connect_timeout_sec: float = 5.0
    total_timeout_sec: float = 30.0
    max_response_bytes: int = 64 * 1024
    allow_http: bool = False
    ca_bundle: str | None = None
    policy: AddressPolicy = field(default_factory=AddressPolicy)
    user_agent: str = "Sundial-Webhooks/1"
    #: How long a host's resolution is reused (0: resolve for every request). Short: a changed DNS record
    #: applies within it; every request still checks the addresses and connects to the one it checked.
    resolve_ttl_sec: float = 5.0
    #: Connections kept open at most (every destination together); a request waits for one beyond that. The
    #: pool's own bookkeeping per request grows with its connections, so a process with one destination and
    #: many requests in flight sends cheaper through a few.
    max_connections: int = 100

    def __post_init__(self) -> None:
        if not 0 < self.connect_timeout_sec <= self.total_timeout_sec:
            raise ValueError("connect_timeout_sec must be > 0 and at most total_timeout_sec")
        if self.max_response_bytes < 0:
            raise ValueError("max_response_bytes must be >= 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if self.resolve_ttl_sec < 0:
            raise ValueError("resolve_ttl_sec must be >= 0")

    @classmethod
    def from_settings(cls, settings: DeliverySettings, env: str) -> SenderConfig:
        """The process's configuration; plain HTTP only with ``SUNDIAL_ENV=dev``."""
        return cls(
            connect_timeout_sec=min(settings.delivery_connect_timeout_sec, settings.delivery_total_timeout_sec),
            total_timeout_sec=settings.delivery_total_timeout_sec,
            max_response_bytes=settings.delivery_max_response_bytes,
            allow_http=env == "dev",
            ca_bundle=settings.delivery_ca_bundle,
            policy=AddressPolicy.from_strings(settings.delivery_allowed_networks),
        )


@dataclass(frozen=True)
class OutboundRequest:
    """One signed POST: ``msg_id`` is the ``webhook-id`` (the same for every retry of one message)."""

    url: str
    body: bytes
    msg_id: str
    secrets: tuple[str, ...]
    purpose: Purpose
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Networks an administrator allowed for this destination only (e.g. ``127.0.0.1/32`` in development).
    allowed: tuple[IPNetwork, ...] = ()
    content_type: str = "application/json"


@dataclass(frozen=True)
class Outcome:
    """What one request (or the last of its attempts) came to."""

    status: int | None
    body: bytes = b""
    truncated: bool = False
    error: str | None = None
    retry_after_sec: float | None = None
    refused: bool = False
    attempts: int = 1
    elapsed_sec: float = 0.0
    address: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        """A transient failure: no response (timeout, connection refused) or a retryable status."""
        if self.refused or self.ok:
            return False
        return self.status is None or self.status in RETRYABLE_STATUSES

    @property
    def label(self) -> str:
        if self.refused:
            return "refused"
        if self.status is None:
            return "error"
        return f"{self.status // 100}xx"


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (seconds or an HTTP date), or None when absent/invalid."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


class Sender:
    """Sends :class:`OutboundRequest` s. Safe to share; :meth:`close` (or ``async with``) releases connections."""

    def __init__(
        self,
        config: SenderConfig | None = None,
        resolver: Resolver | None = None,
        clock: Clock | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``transport`` replaces the network for tests that must show what would be sent, and where."""
        self.config = config or SenderConfig()
        self._clock = clock or SystemClock()
        self._resolver: Resolver = resolver or SystemResolver()
        if self.config.resolve_ttl_sec > 0:
            self._resolver = CachingResolver(self._resolver, self._clock, self.config.resolve_ttl_sec)
        verify = ssl.create_default_context(cafile=self.config.ca_bundle) if self.config.ca_bundle else True
        self._client = httpx.AsyncClient(
            verify=verify,
            trust_env=False,
            follow_redirects=False,
            transport=transport,
            limits=httpx.Limits(
                max_connections=self.config.max_connections, max_keepalive_connections=self.config.max_connections
            ),
            timeout=httpx.Timeout(self.config.total_timeout_sec, connect=self.config.connect_timeout_sec),
        )

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.aclose()

    async def send(self, request: OutboundRequest) -> Outcome:
        """One attempt; never raises for what the network or the receiver did (the outcome says it)."""
        started = self._clock.monotonic()
        with tracer.start_as_current_span(
            "delivery send", attributes={"sundial.delivery.purpose": request.purpose}
        ) as span:
            try:
                async with asyncio.timeout(self.config.total_timeout_sec):
                    outcome = await self._send(request)
            except (AddressRefused, URLRefused, ValueError) as exc:
                outcome = Outcome(status=None, error=str(exc), refused=True)
            except TimeoutError:
                outcome = Outcome(status=None, error=f"no response within {self.config.total_timeout_sec:g} s")
            except httpx.HTTPError as exc:
                outcome = Outcome(status=None, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
            elapsed = self._clock.monotonic() - started
            outcome = replace(outcome, elapsed_sec=elapsed)
            span.set_attribute("sundial.delivery.outcome", outcome.label)
            if outcome.status is not None:
                span.set_attribute("http.response.status_code", outcome.status)
        DELIVERIES.labels(request.purpose, outcome.label).inc()
        DELIVERY_SECONDS.labels(request.purpose).observe(elapsed)
        if not outcome.ok:
            log.info(
                "outbound %s request %s: %s",
                request.purpose,
                request.msg_id,
                outcome.error or f"HTTP {outcome.status}",
            )
        return outcome

    async def deliver(self, request: OutboundRequest, policy: RetryPolicy) -> Outcome:
        """:meth:`send` until it succeeds, fails for good, or ``policy.max_attempts`` are spent."""
        attempt = 0
        while True:
            attempt += 1
            outcome = replace(await self.send(request), attempts=attempt)
            if not outcome.retryable or attempt >= policy.max_attempts:
                return outcome
            delay = policy.delay_ms(attempt) / 1000
            asked = outcome.retry_after_sec
            if asked is not None and outcome.status in (429, 503) and asked <= policy.max_delay_ms / 1000:
                delay = max(delay, asked)
            await self._clock.sleep(delay)

    async def check_destination(self, url: str, allowed: tuple[IPNetwork, ...] = ()) -> tuple[httpx.URL, IPAddress]:
        """``url`` parsed and the address a request to it would go to; :class:`URLRefused` or
        :class:`~.address_policy.AddressRefused` saying why none may (the API's check of a new destination)."""
        parsed = check_url(url, self.config.allow_http)
        host = parsed.host
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            addresses: Sequence[IPAddress] = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                addresses = await self._resolver.resolve(host, port)
            except OSError as exc:
                raise AddressRefused(f"{host} does not resolve: {exc.strerror or exc}") from None
        return parsed, check_addresses(host, addresses, self.config.policy.with_allowed(allowed))

    async def _send(self, request: OutboundRequest) -> Outcome:
        check_header_values(request.headers)
        url, address = await self.check_destination(request.url, request.allowed)
        host = url.host
        timestamp = int(self._clock.now().timestamp())
        headers = {
            **request.headers,
            **signed_headers(request.secrets, request.msg_id, timestamp, request.body),
            "content-type": request.content_type,
            "user-agent": self.config.user_agent,
            # The cap counts the bytes on the wire: a compressed body could expand far past it.
            "accept-encoding": "identity",
            "host": url.netloc.decode("ascii"),
        }
        extensions = {"sni_hostname": host} if url.scheme == "https" else {}
        target = url.copy_with(host=str(address))
        async with self._client.stream(
            "POST", target, content=request.body, headers=headers, extensions=extensions
        ) as response:
            body, truncated = await _read_capped(response, self.config.max_response_bytes)
            return Outcome(
                status=response.status_code,
                body=body,
                truncated=truncated,
                retry_after_sec=parse_retry_after(response.headers.get("retry-after"), self._clock.now().timestamp()),
                address=str(address),
            )


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        if size + len(chunk) > cap:
            chunks.append(chunk[: cap - size])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False
