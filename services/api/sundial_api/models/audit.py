"""The audit trail as the API shows it: ``GET /v1/jobs/{id}/audit`` and ``GET /v1/executions/{id}/audit``."""

from __future__ import annotations

from typing import Any

from sundial_client.models.audit import AuditEntry, AuditPage
from sundial_common.stores.audit import AuditEntry as StoredEntry


def render_entry(entry: StoredEntry) -> dict[str, Any]:
    return {
        "at": entry.at,
        "action": entry.action,
        "fromState": entry.from_state,
        "toState": entry.to_state,
        "actor": entry.actor,
        "detail": entry.detail,
    }
