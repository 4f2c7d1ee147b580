"""Executions: the execution and attempt views (`GET /v1/executions/{id}`) and their pages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sundial_client.models.executions import (
    Attempt,
    Execution,
    ExecutionDetail,
    ExecutionList,
    ExecutionPage,
    ExecutionState,
    Priority,
)
from sundial_common.security.encryption import LOG_TAIL, PROGRESS, RESULT, TRACEBACK, TenantCipher


def render_execution(row: Mapping[str, Any], trace_link_template: str | None, cipher: TenantCipher) -> dict[str, Any]:
    """An ``executions`` row as the Execution view (result and error opened with the tenant's ``cipher``);
    ``trace_link_template`` None (no trace backend): no link."""
    trace_id = row["trace_id"]
    return {
        "executionId": str(row["id"]),
        "jobId": str(row["job_id"]),
        "scheduledFor": row["scheduled_for"],
        "fireAt": row["fire_at"],
        "triggered": row["triggered"],
        "causedBy": [str(i) for i in row["caused_by"]] if row.get("caused_by") else None,
        "cancelRequestedAt": row["cancel_requested_at"],
        "state": row["state"],
        "attempt": row["attempt"],
        "maxAttempts": row["max_attempts"],
        "nextAttemptAt": row.get("next_attempt_at"),
        "heldBy": str(row["held_by"]) if row.get("held_by") is not None else None,
        "shard": row["shard"],
        "fenceToken": row["fence_token"],
        "pool": row["pool"],
        "handler": row["handler"],
        "priority": row["priority"],
        "workerId": row["worker_id"],
        "createdAt": row["created_at"],
        "publishedAt": row["published_at"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "result": cipher.open_json(row["result"], RESULT),
        "error": cipher.open_error(row["error"]),
        "traceId": trace_id,
        "traceLink": trace_link_template.format(trace_id=trace_id) if trace_id and trace_link_template else None,
    }


def render_pending_trigger(job: Mapping[str, Any], trace_link_template: str | None) -> dict[str, Any]:
    """A job's pending manual run as the ExecutionDetail view: PENDING with no attempt until its shard leader
    creates the execution (under its fence: ``fenceToken`` 0 until then), so a trigger's 202 names an
    execution that is readable at once."""
    traceparent = job["trigger_traceparent"]
    trace_id = traceparent.split("-")[1] if traceparent and traceparent.count("-") >= 2 else None
    max_attempts = (job["retry_policy"] or {}).get("maxAttempts", 1)
    return {
        "executionId": str(job["trigger_execution_id"]),
        "jobId": str(job["id"]),
        "scheduledFor": job["trigger_at"],
        "fireAt": job["trigger_at"],
        "triggered": True,
        "causedBy": None,
        "cancelRequestedAt": None,
        "state": ExecutionState.PENDING.value,
        "attempt": 1,
        "maxAttempts": max_attempts,
        "nextAttemptAt": None,
        "heldBy": None,
        "shard": job["shard"],
        "fenceToken": 0,
        "pool": job["pool"],
        "handler": job["handler"],
        "priority": job["priority"],
        "workerId": None,
        "createdAt": job["trigger_at"],
        "publishedAt": None,
        "startedAt": None,
        "finishedAt": None,
        "result": None,
        "error": None,
        "traceId": trace_id,
        "traceLink": trace_link_template.format(trace_id=trace_id) if trace_id and trace_link_template else None,
        "attempts": [],
    }


def render_attempt(row: Mapping[str, Any], cipher: TenantCipher) -> dict[str, Any]:
    """An ``execution_attempts`` row as the Attempt view."""
    return {
        "attempt": row["attempt"],
        "workerId": row["worker_id"],
        "state": row["state"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
        "error": cipher.open_error(row["error"]),
        "traceback": cipher.open_json(row.get("traceback"), TRACEBACK),
        "logTail": tail.splitlines() if (tail := cipher.open_json(row.get("log_tail"), LOG_TAIL)) else None,
        "progress": cipher.open_json(row["progress"], PROGRESS),
    }
