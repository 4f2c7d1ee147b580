"""Redis keys that carry signals between processes about one execution: liveness and cancellation.

``sundial:hb:<execution id>`` — a worker running the execution renews it (value: the worker's id, TTL
``heartbeat_ttl_sec``); the sweeper treats a RUNNING execution whose key is missing, or names another
worker, as lost. ``sundial:cancel:<execution id>`` — set by the API (``POST /v1/executions/{id}/cancel``)
and by the dispatcher (overlap policy CANCEL_RUNNING); the worker running the execution polls it and
stops the handler. The liveness scripts below are what every holder of executions (a worker, the worker gateway
for its callers) renews and drops these keys with. Both are hints: Postgres holds the truth (``executions.worker_id``,
``executions.cancel_requested_at``), so losing Redis delays a signal but never loses one.
"""

from __future__ import annotations

from uuid import UUID

HEARTBEAT_KEY_PREFIX = "sundial:hb:"
CANCEL_KEY_PREFIX = "sundial:cancel:"
# Renew many liveness keys in ONE command (KEYS: the keys; ARGV: the holder, the TTL in ms): a pipeline of SETs
# costs redis-py a pack and a parse per key, which at thousands of executions a second was most of the poll loop's
# CPU. The keys of one call may live on different Redis Cluster slots; Sundial runs one Redis (or a proxy) for them.
RENEW_LIVENESS_SCRIPT = """
for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2]) end
return #KEYS
"""
# Keep liveness keys that are missing (Redis flushed or restarted: the sweeper waits for this renewal) or
# still ours, never one another worker holds now (a retry of an attempt the sweeper took from us).
KEEP_LIVENESS_SCRIPT = """
local n = 0
for i = 1, #KEYS do
  local holder = redis.call('GET', KEYS[i])
  if holder == false or holder == ARGV[1] then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    n = n + 1
  end
end
return n
"""
# Drop liveness keys only where they are still ours: after a late (rejected) write, the sweeper may
# have handed the execution to another worker, whose key has the same name.
RELEASE_LIVENESS_SCRIPT = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then n = n + redis.call('DEL', KEYS[i]) end
end
return n
"""
#: A cancel flag outlives any execution it could concern (Postgres keeps the request anyway).
CANCEL_KEY_TTL_SEC = 7 * 24 * 3600


def heartbeat_key(execution_id: UUID | str) -> str:
    """The Redis key whose presence says a worker is still running ``execution_id``."""
    return f"{HEARTBEAT_KEY_PREFIX}{execution_id}"


def cancel_key(execution_id: UUID | str) -> str:
    """The Redis key whose presence asks the worker running ``execution_id`` to stop it."""
    return f"{CANCEL_KEY_PREFIX}{execution_id}"
