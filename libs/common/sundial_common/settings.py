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
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_MODEL_CONFIG = SettingsConfigDict(env_prefix="SUNDIAL_", extra="ignore")


class CommonSettings(BaseSettings):
    """Connection strings and knobs that every process needs."""

    model_config = _MODEL_CONFIG

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
    jwt_secret: str = Field(
        "sundial-dev-signing-key-change-me",
        description="HS256 key that signs bearer tokens. The default is for local development only.",
    )
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
    # --- replay (issue 13) ---
    topic_retention_ms: int = Field(
        7 * 24 * 3600 * 1000,
        ge=60_000,
        description="`retention.ms` of the pool topics Sundial creates (default 7 days): how far back a replay can "
        "reach on a real Kafka. Tansu keeps messages while it runs, whatever this says.",
    )
    # --- analytics (issue 16) ---
    execution_retention_days: float = Field(
        30.0,
        ge=0,
        description="Finished executions older than this are deleted from Postgres by the analytics service; "
        "their history stays in ClickHouse (GET /v1/executions/{id} then answers 410). 0 = kept forever.",
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
