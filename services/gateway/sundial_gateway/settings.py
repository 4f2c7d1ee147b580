"""The worker gateway's settings: the shared connection settings plus its HTTP server, caps and limits.

Every field reads ``SUNDIAL_<FIELD>`` (``SUNDIAL_GATEWAY_PORT`` …); the CLI's options override them.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from sundial_common.runtime.settings import CommonSettings

from sundial_gateway.hooks import PausePoint


class GatewaySettings(CommonSettings):
    """Settings of ``sundial gateway``."""

    gateway_host: str = Field("127.0.0.1", description="Interface the gateway's HTTP server binds.")
    gateway_port: int = Field(8081, ge=0, le=65535, description="TCP port the gateway binds (0 = any free port).")
    gateway_max_pull: int = Field(
        256, ge=1, le=1000, description="Most executions one pull may ask for (`max`), and so per start CAS."
    )
    gateway_max_wait_ms: int = Field(
        30_000, ge=0, le=120_000, description="Longest long poll a pull may ask for (`waitMs`)."
    )
    gateway_leave_after_sec: float = Field(
        2.0,
        gt=0,
        description="A pool's consumer leaves its group once no pull has waited on it for this long, so that an "
        "idle gateway holds no partitions other gateways' callers could be served from.",
    )
    gateway_session_timeout_sec: float = Field(
        6.0, ge=1, description="How long the consumer group waits for a silent gateway before moving its partitions."
    )
    gateway_heartbeat_ttl_sec: float = Field(
        6.0,
        gt=0,
        description="Lifetime of a running execution's liveness key, renewed by each heartbeat: a worker that stops "
        "heartbeating loses the execution to the sweeper this long after its last one.",
    )
    gateway_timeout_grace_sec: float = Field(
        5.0,
        ge=0,
        description="How long past its deadline an attempt's finish is still taken as the worker reports it; "
        "later, it is recorded TIMED_OUT.",
    )
    gateway_token_cache_sec: float = Field(
        2.0,
        ge=0,
        le=2.0,
        description="How long a pool token's registry entry (revoked or not) and its pool's are trusted: a "
        "revocation applies within this time.",
    )
    gateway_rate_per_token: float = Field(
        500.0,
        gt=0,
        description="Requests per second one pool token may make (a burst of one second's worth). Every worker of "
        "a pool usually shares its token, and a busy worker makes tens a second (pulls, heartbeats, finishes).",
    )
    gateway_max_result_bytes: int = Field(
        256 * 1024, ge=1024, description="Largest `result` a finish may carry (JSON bytes); beyond it, 422."
    )
    gateway_max_progress_bytes: int = Field(
        64 * 1024, ge=256, description="Largest `progress` a heartbeat may carry (JSON bytes); beyond it, 422."
    )
    gateway_max_traceback_chars: int = Field(
        16 * 1024, ge=256, description="A finish's traceback is kept to its last this many characters."
    )
    gateway_max_log_tail_chars: int = Field(
        32 * 1024, ge=256, description="A finish's log tail is kept to its last this many characters."
    )
    gateway_redis_timeout_sec: float = Field(
        2.0, gt=0, description="Longest wait for one Redis call (liveness keys, cancel flags, the rate limit)."
    )
    gateway_db_pool_size: int = Field(10, ge=1, description="Postgres connections.")
    gateway_test_pause_at: PausePoint = Field(
        "",
        description="Test hook, never set in production: hold the first call that reaches this point (`pull`, "
        "`start` or `finish`) for `gateway_test_pause_sec`, so a fault test can kill the gateway there. Empty: inert.",
    )
    gateway_test_pause_sec: float = Field(
        600.0, ge=0, description="Test hook: how long `gateway_test_pause_at` holds the call."
    )

    @model_validator(mode="after")
    def _check_ttl(self) -> GatewaySettings:
        if self.gateway_heartbeat_ttl_sec < 2:
            raise ValueError("gateway_heartbeat_ttl_sec must be at least 2 s: workers heartbeat at a third of it")
        return self
