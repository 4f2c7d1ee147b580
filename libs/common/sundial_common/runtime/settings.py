"""Configuration shared by every Sundial process.

Each service composes its own settings class from these pieces; every field reads an environment
variable with the ``SUNDIAL_`` prefix (``SUNDIAL_DATABASE_URL`` …) so a process is configured the same
way on a laptop, in compose and in Kubernetes. CLI options fall back to these variables, and every
command's ``--help`` lists them, generated from its settings class (:class:`SettingsHelpParser`).
"""

from __future__ import annotations

import argparse
import os
import socket
import textwrap
from collections.abc import Iterable
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_MODEL_CONFIG = SettingsConfigDict(env_prefix="SUNDIAL_", extra="ignore")

#: The signing key every process has when none is configured. It is public (it is in the source), so only
#: SUNDIAL_ENV=dev may use it (sundial_common.security.auth).
DEV_SIGNING_KEY = "sundial-dev-signing-key-change-me"
#: HS256 keys shorter than this are refused: RFC 7518 section 3.2 asks for at least the hash's 256 bits.
MIN_KEY_BYTES = 32
_NEW_KEY = "python3 -c 'import secrets; print(secrets.token_urlsafe(48))'"


class EncryptionSettings(BaseSettings):
    """Where the master key comes from (composed into every process's settings)."""

    model_config = SettingsConfigDict(env_prefix="SUNDIAL_", extra="ignore")

    env: Literal["dev", "production"] = Field(
        "production",
        description="`dev` for a development machine (make up, make run and the tests set it): allows the built-in "
        "development signing key and a generated master key under the dev root. In production every process "
        "refuses to start with the development key, and needs SUNDIAL_MASTER_KEY or SUNDIAL_MASTER_KEY_FILE.",
    )
    master_key: str | None = Field(
        None,
        repr=False,
        description="The master key that wraps tenants' data keys: 32 random bytes as base64 or 64 hex digits "
        "(`python -c 'import os,base64;print(base64.b64encode(os.urandom(32)).decode())'`). Processes that "
        "read tenants' data (API, workers) refuse to start without it outside SUNDIAL_ENV=dev, or with "
        "another key than the one that wrapped the stored data keys.",
    )
    master_key_file: str | None = Field(
        None, description="A file holding the master key (same format), instead of SUNDIAL_MASTER_KEY."
    )
    dev_root: str = Field(".sundial", description="Development state directory (the dev master key lives here).")


class DeliverySettings(BaseSettings):
    """How Sundial's outbound requests (notifications, HTTP targets) are bounded and where they may go."""

    model_config = SettingsConfigDict(env_prefix="SUNDIAL_", extra="ignore")

    delivery_connect_timeout_sec: float = Field(
        5.0, gt=0, le=60, description="Seconds to connect to a destination (TLS handshake included)."
    )
    delivery_total_timeout_sec: float = Field(
        30.0, gt=0, le=900, description="Seconds one outbound request may take, from resolution to the last byte."
    )
    delivery_max_response_bytes: int = Field(
        65536,
        ge=0,
        le=16 * 1024 * 1024,
        description="Bytes of a destination's response body kept; the rest is dropped.",
    )
    delivery_ca_bundle: str | None = Field(
        None,
        description="A PEM file of the certificate authorities trusted for HTTPS destinations (default: the system's).",
    )
    delivery_allowed_networks: list[str] = Field(
        default_factory=list,
        description="Networks outbound requests may reach although they are not public (JSON list of CIDRs, e.g. "
        '`["10.20.0.0/16"]`). Loopback, private, link-local and metadata addresses are refused otherwise.',
    )


class CommonSettings(EncryptionSettings):
    """Connection strings and knobs that every process needs (and the master key's source, for those that
    read tenants' data)."""

    model_config = _MODEL_CONFIG

    #: Whether the process verifies bearer tokens with the signing keys below (and so must refuse the public
    #: development key outside SUNDIAL_ENV=dev). A worker verifies none: refusing it the default key only stopped
    #: `sundial worker` from starting as documented.
    verifies_tokens: ClassVar[bool] = True

    database_url: str = Field(
        "postgresql://sundial@127.0.0.1:15432/sundial",
        description="Postgres DSN (asyncpg form). Postgres is the only source of truth.",
    )
    redis_url: str = Field("redis://127.0.0.1:16379/0", description="Redis URL (hot window, heartbeats).")
    etcd_endpoint: str = Field("127.0.0.1:12379", description="etcd host:port used for shard leases.")
    kafka_bootstrap: str = Field("127.0.0.1:19092", description="Kafka bootstrap servers.")
    shards: int = Field(
        8,
        ge=1,
        le=1024,
        description="Number of dispatcher shards (hot-window ZSETs). Every process must use the same value: "
        "a job's shard is stored with it.",
    )
    hot_window_sec: int = Field(3600, ge=10, description="Occurrences due within this horizon live in Redis.")
    # --- keys and tokens (sundial_common.security.auth) ---
    # `env` (dev or production) comes with the master key's settings (EncryptionSettings).
    jwt_secret: str = Field(
        DEV_SIGNING_KEY,
        description=f"HS256 key that signs and verifies bearer tokens (at least {MIN_KEY_BYTES} bytes). The default "
        "is the public development key, refused unless SUNDIAL_ENV=dev. Empty = no HS256 key (tokens only from "
        "SUNDIAL_JWKS_URL).",
    )
    jwt_keys: dict[str, str] = Field(
        default_factory=dict,
        description='HS256 keys by key id, newest first, as JSON (`{"2026-12": "<key>", "2026-11": "<old key>"}`): '
        "the first signs, every one verifies (rotation without downtime). Replaces SUNDIAL_JWT_SECRET.",
    )
    jwks_url: str | None = Field(
        None,
        description="JWKS document (https URL or file path) whose RS256/ES256 public keys verify tokens issued by "
        "an external identity provider; unset = none accepted.",
    )
    jwks_refresh_sec: float = Field(300.0, ge=1, description="How often the JWKS document is re-read.")
    jwt_audience: str = Field("sundial", min_length=1, description="Every token's `aud` must be this.")
    jwt_issuers: list[str] = Field(
        default_factory=lambda: ["sundial"],
        description='Accepted `iss` values, as JSON (`["sundial", "https://idp.example.com/"]`).',
    )
    jwt_leeway_sec: float = Field(
        30.0, ge=0, le=300, description="Clock skew tolerated on a token's `exp`, `nbf` and `iat`."
    )
    jwt_tenant_claim: str = Field("tenant", min_length=1, description="The claim that names the token's tenant.")
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces endpoint (e.g. http://jaeger:4318/v1/traces); unset = no export."
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of new traces recorded and exported (parent-based: a trace is kept or dropped whole). "
        "Every execution keeps a trace id either way.",
    )
    trace_link_template: str = Field(
        "http://127.0.0.1:16686/trace/{trace_id}",
        description="Where a trace id can be looked up (Jaeger UI's /trace/{trace_id}). Executions show this "
        "link (`traceLink`) only while traces are exported (SUNDIAL_OTLP_ENDPOINT set); empty = never.",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve Prometheus metrics at http://<metrics host>:<port>/metrics; unset = not served. "
        "Dispatcher, hydrator, sweeper and worker; the API serves /metrics on its own port instead.",
    )
    metrics_host: str = Field("127.0.0.1", description="Interface the metrics port binds (0.0.0.0 in containers).")
    lease_ttl_sec: float = Field(
        5.0, ge=2.0, description="etcd lease TTL of a leadership (shard, hydrator, sweeper) and of a replica's entry."
    )
    lease_margin_sec: float = Field(
        1.0, gt=0, description="A leader stops trusting its term this long before it could expire."
    )
    instance_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="Identity of this process in leases, heartbeats and attempts (default: <hostname>-<pid>).",
    )
    # --- replay ---
    topic_retention_ms: int = Field(
        7 * 24 * 3600 * 1000,
        ge=60_000,
        description="`retention.ms` of the pool topics Sundial creates (default 7 days): how far back a replay can "
        "reach on a real Kafka. Tansu keeps messages while it runs, whatever this says.",
    )
    # --- analytics ---
    execution_retention_days: float = Field(
        30.0,
        ge=0,
        description="Days of executions Postgres keeps: the active sweeper drops each day's partition of executions "
        "and attempts once it ended this long ago, unless something in it is still open, an undelivered dead letter "
        "or unreplicated; their history stays in ClickHouse (GET /v1/executions/{id} then answers 410). 0 = kept "
        "forever.",
    )
    log_level: str = Field("INFO", description="Python logging level.")
    log_format: str = Field("text", description="`text` or `json` (one JSON object per line).")

    @property
    def trace_link(self) -> str | None:
        """The trace link template to show, or None when no trace backend is configured.

        A link is only useful where the trace was sent: without an OTLP exporter nothing is recorded and
        the default Jaeger link would lead nowhere (``make run`` starts no Jaeger).
        """
        return self.trace_link_template if self.otlp_endpoint and self.trace_link_template else None

    @model_validator(mode="after")
    def _signing_keys_are_safe(self) -> CommonSettings:
        if not self.verifies_tokens:
            return self
        if self.jwt_keys and "jwt_secret" in self.model_fields_set:
            raise ValueError("set SUNDIAL_JWT_KEYS or SUNDIAL_JWT_SECRET, not both (move the secret into the keys)")
        named = (
            [(f"SUNDIAL_JWT_KEYS[{kid!r}]", secret) for kid, secret in self.jwt_keys.items()]
            if self.jwt_keys
            else [("SUNDIAL_JWT_SECRET", self.jwt_secret)]
            if self.jwt_secret
            else []
        )
        for variable, secret in named:
            if secret == DEV_SIGNING_KEY and self.env != "dev":
                raise ValueError(
                    f"{variable} is the built-in development signing key, which is public: anyone could mint "
                    f"tokens. Set SUNDIAL_JWT_SECRET to a random key of at least {MIN_KEY_BYTES} bytes (e.g. "
                    f"`{_NEW_KEY}`), or SUNDIAL_JWT_KEYS / SUNDIAL_JWKS_URL; on a developer machine, SUNDIAL_ENV=dev "
                    "allows the development key"
                )
            if len(secret.encode()) < MIN_KEY_BYTES:
                raise ValueError(
                    f"{variable} is {len(secret.encode())} bytes: an HS256 key needs at least {MIN_KEY_BYTES} "
                    f"(e.g. `{_NEW_KEY}`)"
                )
        return self

    @field_validator("log_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in ("text", "json"):
            raise ValueError("log_format must be `text` or `json`")
        return value


def env_var(settings: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field`` of ``settings`` (``SUNDIAL_DATABASE_URL``)."""
    return f"{settings.model_config.get('env_prefix', '')}{field}".upper()


def _default_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def environment_help(settings: type[BaseSettings], fields: Iterable[str] | None = None) -> str:
    """The variables ``settings`` reads (or only ``fields`` of them), with defaults and descriptions."""
    chosen = set(fields) if fields is not None else None
    lines = ["environment (command-line options override these):"]
    for name, info in settings.model_fields.items():
        if chosen is not None and name not in chosen:
            continue
        default = "" if info.default_factory is not None else f" (default: {_default_text(info.default)})"
        lines.append(f"  {env_var(settings, name)}{default}")
        if info.description:
            lines += textwrap.wrap(info.description, width=100, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


class SettingsHelpParser(argparse.ArgumentParser):
    """An argument parser whose ``--help`` ends with the ``SUNDIAL_*`` variables the command reads.

    The list is generated from the command's settings class, so a new setting appears in ``--help``
    without anyone remembering to document it. ``fields`` narrows it for commands that read only a few.
    """

    def __init__(
        self, *args: Any, settings: type[BaseSettings], fields: Iterable[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._environment = environment_help(settings, fields)

    def format_help(self) -> str:
        return f"{super().format_help()}\n{self._environment}\n"

    def add_log_and_metrics_arguments(self) -> None:
        """``--log-level`` and ``--metrics-port``, as a long-running service's command takes them."""
        self.add_argument("--log-level", help="Logging level (env SUNDIAL_LOG_LEVEL).")
        self.add_argument(
            "--metrics-port",
            type=int,
            help="Serve Prometheus metrics at /metrics on this port (env SUNDIAL_METRICS_PORT; default: not served).",
        )


_Settings = TypeVar("_Settings", bound=BaseSettings)


def load_settings(settings: type[_Settings], parser: argparse.ArgumentParser, **overrides: Any) -> _Settings:
    """``settings`` from the environment and ``overrides`` (None = not given); a bad value exits 2 saying why.

    Each problem is one line naming the variable (a refused signing key says how to set one), not a traceback.
    """
    try:
        return settings(**{name: value for name, value in overrides.items() if value is not None})
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"  {env_var(settings, where) if where else ''}{': ' if where else ''}{message}")
        parser.error("invalid configuration:\n" + "\n".join(lines))
