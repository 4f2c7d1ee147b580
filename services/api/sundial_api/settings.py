"""Configuration of the API process: the shared connection settings plus the HTTP and validation limits.

Every field reads ``SUNDIAL_<NAME>`` from the environment (``SUNDIAL_PORT``, ``SUNDIAL_MAX_PAYLOAD_BYTES`` …);
``sundial api`` options override them.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import Field, SecretStr, model_validator
from sundial_common.delivery.mail import MailRelay
from sundial_common.runtime.settings import CommonSettings, DeliverySettings
from sundial_common.security.auth import TENANT

#: An SSO identity's role: a tenant, or ``admin:`` and a tenant.
_SSO_ROLE = re.compile(r"^(admin:)?" + TENANT.removeprefix("^"))


class ApiSettings(DeliverySettings, CommonSettings):
    """Settings of one API replica. Replicas are stateless, so every replica gets the same values."""

    host: str = Field("127.0.0.1", description="Interface the HTTP server binds.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port the HTTP server binds (0 = any free port).")
    max_payload_bytes: int = Field(
        256 * 1024, ge=1, description="Largest accepted job `payload`, measured as compact JSON; larger → 413."
    )
    max_request_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest accepted request body of any kind; larger → 413."
    )
    run_at_grace_sec: int = Field(
        60,
        ge=0,
        description="A ONE_SHOT `runAt` at most this far in the past fires at once; further in the past → 422.",
    )
    default_timeout_sec: int = Field(600, ge=1, le=604800, description="`timeoutSec` of a job that does not give one.")
    min_interval_sec: int = Field(
        1, ge=1, description="Smallest accepted `intervalSec` of an INTERVAL job; smaller → 422."
    )
    db_pool_size: int = Field(20, ge=1, le=1000, description="Most Postgres connections one replica holds.")
    redis_timeout_sec: float = Field(
        1.0,
        gt=0,
        description="Connect/command timeout for Redis. Redis is only a cache on the request path, so a slow "
        "Redis must not stall requests: past this the API answers from Postgres and logs a warning.",
    )
    tenant_cache_sec: float = Field(
        2.0,
        ge=0,
        description="How long a replica trusts what it read of a tenant's registry entry (registered, suspended, "
        "quotas): a change made through another replica applies here within this time.",
    )
    create_group_max: int = Field(
        500,
        ge=1,
        le=1000,
        description="Most concurrent single creates (`POST /v1/jobs`) written by one statement and one commit "
        "(group commit: each request is still answered on its own, once its job is durable); 1 writes each alone.",
    )
    create_group_writers: int = Field(
        4,
        ge=1,
        le=64,
        description="How many groups of single creates are written at once (each on its own connection): more "
        "overlap commits' WAL flushes on a slow disk, fewer make bigger groups (less CPU per job).",
    )
    access_log: bool = Field(False, description="Log one line per request (uvicorn's access log).")
    idempotency_ttl_sec: int = Field(
        86400, ge=60, description="How long an `Idempotency-Key` of `POST /v1/jobs` is remembered (per tenant)."
    )
    idempotency_lock_sec: float = Field(
        10.0,
        gt=0,
        description="A create holding an `Idempotency-Key` that has not finished after this long is presumed dead "
        "(the API or Postgres went away): a retry with the same key and body takes over (its job, if the first "
        "request ever commits one, is rolled back). Until then a retry gets 409.",
    )
    analytics_url: str = Field(
        "http://127.0.0.1:8124",
        description="The analytics service's stats endpoint (SUNDIAL_ANALYTICS_PORT), which answers /v1/stats "
        "from ClickHouse.",
    )
    analytics_timeout_sec: float = Field(10.0, gt=0, description="How long a /v1/stats query may take.")
    console_dev_tenant: str = Field(
        "demo",
        description="The tenant the web console's one-click sign-in opens a session for; offered only when "
        "SUNDIAL_ENV=dev and the browser is on this machine (loopback).",
    )
    console_refresh_sec: float = Field(
        2.0, gt=0, le=60, description="How often the web console's live parts (lists, detail pages) refresh."
    )

    notification_max_attempts: int = Field(
        8,
        ge=1,
        le=50,
        description="Attempts of one notification delivery before it is FAILED (backoff doubles "
        "from 10 s to an hour; a 429 or 503's Retry-After is honoured up to that hour).",
    )
    notification_concurrency: int = Field(
        10, ge=1, le=200, description="Notification requests one API replica has in flight at once."
    )
    notification_tenant_concurrency: int = Field(
        20, ge=1, le=10_000, description="Notification requests one tenant has in flight at once, over all replicas."
    )
    notification_destination_concurrency: int = Field(
        4,
        ge=1,
        le=10_000,
        description="Notification requests one destination (a subscription's URL) has in flight at once, over all "
        "replicas.",
    )
    notification_tenant_per_minute: int = Field(
        600, ge=1, le=1_000_000, description="Notification requests sent for one tenant in any minute, at most."
    )
    notification_destination_per_minute: int = Field(
        120,
        ge=1,
        le=1_000_000,
        description="Notification requests sent to one destination (a subscription's URL) in any minute, at most; "
        "the others wait, due, for the next minute.",
    )
    smtp_host: str | None = Field(
        None,
        description="The SMTP relay e-mail notifications go through (unset: e-mail subscriptions are refused with "
        "a 422 naming `email`).",
    )
    smtp_port: int = Field(587, ge=1, le=65535, description="The SMTP relay's port.")
    smtp_starttls: bool = Field(
        True,
        description="Upgrade the relay connection with STARTTLS (certificates checked: SUNDIAL_DELIVERY_CA_BUNDLE).",
    )
    smtp_from: str = Field("sundial@localhost", description="The sender (`From:`) of notification e-mail.")
    smtp_username: str | None = Field(None, description="The relay login's user name (unset: no login).")
    smtp_password: SecretStr | None = Field(None, description="The relay login's password.")
    smtp_timeout_sec: float = Field(10.0, gt=0, le=120, description="Seconds one message may take with the relay.")
    public_url: str = Field(
        "http://127.0.0.1:8080",
        description="The API's address as people reach it: the base of the confirmation link an e-mail "
        "subscription's address is sent.",
    )

    console_sso_headers: list[str] = Field(
        default_factory=list,
        description="Single sign-on behind a trusted proxy: the request headers, as JSON, that carry the signed-in "
        'user\'s identity (`["X-Forwarded-Email", "X-Forwarded-User"]`: the first one present counts). Empty = off. '
        "Trusted only from SUNDIAL_CONSOLE_SSO_PROXIES; who it signs in as: SUNDIAL_CONSOLE_SSO_IDENTITIES.",
    )
    console_sso_proxies: list[str] = Field(
        default_factory=list,
        description='Addresses or networks, as JSON (`["10.0.0.5", "10.1.0.0/16"]`), of the proxies whose SSO '
        "headers are trusted: the peer of the connection must be one. Required with SUNDIAL_CONSOLE_SSO_HEADERS.",
    )
    console_sso_identities: dict[str, str] = Field(
        default_factory=dict,
        description='Who an SSO identity signs in as, as JSON: `{"alice@example.com": "acme", "@example.com": '
        '"globex", "ops@example.com": "admin:acme"}` — a tenant, or `admin:` and a tenant for an operator; a key '
        "starting with `@` matches every address of that domain. An identity not listed may not sign in.",
    )

    @model_validator(mode="after")
    def _sso_is_complete(self) -> ApiSettings:
        if self.console_sso_headers and not self.console_sso_proxies:
            raise ValueError(
                "SUNDIAL_CONSOLE_SSO_HEADERS needs SUNDIAL_CONSOLE_SSO_PROXIES: identity headers are trusted only "
                "from the proxies named there"
            )
        for proxy in self.console_sso_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"SUNDIAL_CONSOLE_SSO_PROXIES: {proxy!r} is not an address or network") from None
        for identity, role in self.console_sso_identities.items():
            if not _SSO_ROLE.match(role):
                raise ValueError(
                    f"SUNDIAL_CONSOLE_SSO_IDENTITIES[{identity!r}]: {role!r} is not a tenant or `admin:<tenant>`"
                )
        return self

    @model_validator(mode="after")
    def _can_verify_tokens(self) -> ApiSettings:
        if not (self.jwt_secret or self.jwt_keys or self.jwks_url):
            raise ValueError(
                "no key verifies bearer tokens: set SUNDIAL_JWT_SECRET, SUNDIAL_JWT_KEYS or SUNDIAL_JWKS_URL"
            )
        return self

    @model_validator(mode="after")
    def _payload_fits_in_request(self) -> ApiSettings:
        if self.max_payload_bytes > self.max_request_bytes:
            raise ValueError(
                f"max_payload_bytes ({self.max_payload_bytes}) cannot exceed max_request_bytes "
                f"({self.max_request_bytes}): the request limit would reject such payloads first"
            )
        return self

    def mail_relay(self) -> MailRelay | None:
        """The SMTP relay e-mail goes through, or None when none is configured."""
        if not self.smtp_host:
            return None
        return MailRelay(
            host=self.smtp_host,
            port=self.smtp_port,
            starttls=self.smtp_starttls,
            sender=self.smtp_from,
            username=self.smtp_username,
            password=self.smtp_password.get_secret_value() if self.smtp_password else None,
            timeout_sec=self.smtp_timeout_sec,
            ca_bundle=self.delivery_ca_bundle,
        )
