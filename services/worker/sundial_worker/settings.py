"""The worker process's settings: the shared connection settings plus the runtime's knobs.

Every field reads ``SUNDIAL_<FIELD>`` (``SUNDIAL_WORKER_CONCURRENCY`` …); the CLI's options override
them. Concurrency has three layers: ``--concurrency``, then ``SUNDIAL_WORKER_CONCURRENCY``, then the
``Worker(concurrency=…)`` the tenant wrote in code.
"""

from __future__ import annotations

from pydantic import Field
from sundial_common.runtime.settings import CommonSettings, DeliverySettings

from sundial_worker.gateway_runtime import GatewayConfig
from sundial_worker.runtime import WorkerConfig
from sundial_worker.sdk import Worker

_DEFAULTS = WorkerConfig()


class WorkerSettings(DeliverySettings, CommonSettings):
    """Settings of ``sundial worker`` (the ``delivery_*`` ones bound a delivery worker's requests)."""

    verifies_tokens = False  # a worker reads Kafka and Postgres, never a bearer token

    worker_app: str | None = Field(None, description="The Worker to serve, as `module:attribute`.")
    worker_concurrency: int | None = Field(
        None, ge=1, description="Handlers running at once (default: the Worker's own `concurrency`)."
    )
    worker_id: str | None = Field(
        None, description="This worker's identity in attempts and heartbeats (default: instance_id)."
    )
    worker_poll_batch: int = Field(_DEFAULTS.poll_batch, ge=1, description="Most messages taken per poll.")
    worker_heartbeat_interval_sec: float = Field(
        _DEFAULTS.heartbeat_interval_sec, gt=0, description="How often liveness keys are renewed."
    )
    worker_heartbeat_ttl_sec: float = Field(
        _DEFAULTS.heartbeat_ttl_sec, gt=0, description="Liveness key lifetime; must exceed the interval."
    )
    worker_commit_interval_sec: float = Field(
        _DEFAULTS.commit_interval_sec, gt=0, description="How often Kafka offsets are committed."
    )
    worker_shutdown_grace_sec: float = Field(
        _DEFAULTS.shutdown_grace_sec, ge=0, description="How long a stop waits for running handlers."
    )
    worker_db_pool_size: int = Field(_DEFAULTS.db_pool_size, ge=1, description="Postgres connections.")
    worker_cancel_poll_interval_sec: float = Field(
        _DEFAULTS.cancel_poll_interval_sec, gt=0, description="How often running executions' cancel flags are read."
    )
    worker_cancel_grace_sec: float = Field(
        _DEFAULTS.cancel_grace_sec,
        ge=0,
        description="How long a handler interrupted by its timeout or a cancel may take to end before it is "
        "abandoned (its attempt is TIMED_OUT or CANCELLED either way).",
    )
    worker_session_timeout_sec: float = Field(
        _DEFAULTS.session_timeout_sec,
        ge=1,
        description="How long the pool's consumer group waits for a silent worker (killed, stopped) before "
        "moving its partitions to the others.",
    )

    worker_pool_cache_sec: float = Field(
        _DEFAULTS.pool_cache_sec,
        ge=0,
        description="How long the worker trusts what it read of its pool's registry entry (which tenants it "
        "admits): a pool re-owned or shared differently applies here within this time.",
    )

    worker_http_target: str | None = Field(
        None,
        description="Run as a delivery worker of this pool (its delivery `http`): POST each execution to the pool's "
        "target instead of running handlers; no `--app`.",
    )
    worker_target_completion_url: str | None = Field(
        None,
        description="The API's URL as HTTP targets reach it (e.g. `https://sundial.example.com`): a delivery worker "
        "sends each request a completion URL under it, for a target that answers 202. Unset, a 202 fails the "
        "execution for good.",
    )
    worker_target_hold_sec: float = Field(
        3600.0,
        gt=0,
        description="How long an attempt a target accepted (202) waits for its completion when the job has no "
        "`timeoutSec`; then the sweeper treats it as lost and the retry policy applies.",
    )

    worker_gateway: str | None = Field(
        None,
        description="The gateway transport: worker gateway URLs, comma-separated, tried in turn. Set, the worker "
        "needs only a pool token (SUNDIAL_WORKER_TOKEN or SUNDIAL_WORKER_TOKEN_FILE) and no database, Redis, "
        "broker or master key.",
    )
    worker_token: str | None = Field(None, description="The pool token of the gateway transport.")
    worker_token_file: str | None = Field(
        None, description="A file holding the pool token (read again when the gateway refuses the one in use)."
    )

    def gateway_config(self, worker: Worker) -> GatewayConfig:
        urls = tuple(u.strip() for u in (self.worker_gateway or "").split(",") if u.strip())
        return GatewayConfig(
            urls=urls,
            token=self.worker_token,
            token_file=self.worker_token_file,
            concurrency=self.worker_concurrency or worker.concurrency,
            heartbeat_interval_sec=self.worker_heartbeat_interval_sec,
            shutdown_grace_sec=self.worker_shutdown_grace_sec,
            cancel_grace_sec=self.worker_cancel_grace_sec,
        )

    def runtime_config(self, worker: Worker) -> WorkerConfig:
        return WorkerConfig(
            concurrency=self.worker_concurrency or worker.concurrency,
            poll_batch=self.worker_poll_batch,
            heartbeat_interval_sec=self.worker_heartbeat_interval_sec,
            heartbeat_ttl_sec=self.worker_heartbeat_ttl_sec,
            commit_interval_sec=self.worker_commit_interval_sec,
            shutdown_grace_sec=self.worker_shutdown_grace_sec,
            db_pool_size=self.worker_db_pool_size,
            cancel_poll_interval_sec=self.worker_cancel_poll_interval_sec,
            cancel_grace_sec=self.worker_cancel_grace_sec,
            session_timeout_sec=self.worker_session_timeout_sec,
            pool_cache_sec=self.worker_pool_cache_sec,
        )

    def identity(self) -> str:
        return self.worker_id or self.instance_id
