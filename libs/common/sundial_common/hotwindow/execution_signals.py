"""Redis keys that carry signals between processes about one execution: liveness and cancellation.

``sundial:hb:<execution id>`` — a worker running the execution renews it (value: the worker's id, TTL
``heartbeat_ttl_sec``); the sweeper treats a RUNNING execution whose key is missing, or names another
worker, as lost. ``sundial:cancel:<execution id>`` — set by the API (``POST /v1/executions/{id}/cancel``)
and by the dispatcher (overlap policy CANCEL_RUNNING); the worker running the execution polls it and
stops the handler. Both are hints: Postgres holds the truth (``executions.worker_id``,
``executions.cancel_requested_at``), so losing Redis delays a signal but never loses one.
"""

from __future__ import annotations

from uuid import UUID

HEARTBEAT_KEY_PREFIX = "sundial:hb:"
CANCEL_KEY_PREFIX = "sundial:cancel:"
#: A cancel flag outlives any execution it could concern (Postgres keeps the request anyway).
CANCEL_KEY_TTL_SEC = 7 * 24 * 3600


def heartbeat_key(execution_id: UUID | str) -> str:
    """The Redis key whose presence says a worker is still running ``execution_id``."""
    return f"{HEARTBEAT_KEY_PREFIX}{execution_id}"


def cancel_key(execution_id: UUID | str) -> str:
    """The Redis key whose presence asks the worker running ``execution_id`` to stop it."""
    return f"{CANCEL_KEY_PREFIX}{execution_id}"
