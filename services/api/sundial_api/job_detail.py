"""A job's full view, as ``GET /v1/jobs/{id}`` and ``GET /v1/jobs:by-key/{key}`` answer it: the job, its latest
executions (and the latest one's state beside the job's), its parents and children in the dependency graph."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

from starlette.responses import Response
from sundial_common.security.auth import Principal
from sundial_common.stores.types import Record

from sundial_api.models.executions import render_execution
from sundial_api.models.jobs import render_job
from sundial_api.problems import not_found
from sundial_api.responses import OrjsonResponse
from sundial_api.state import ApiState

LATEST_EXECUTIONS = 10
LISTED_CHILDREN = 100


def etag(row: Record) -> dict[str, str]:
    """A job's ``version`` as its ETag header."""
    return {"ETag": f'"{row["version"]}"'}


async def job_detail(state: ApiState, principal: Principal, ident: UUID, shown_as: str) -> Response:
    """The job ``ident`` of the caller's tenant with its latest executions and relatives; 404 naming ``shown_as``."""
    # The reads at once; the executions are discarded unless the job is this tenant's.
    dependencies = state.stores.dependencies
    job, executions, parents, children, waiting = await asyncio.gather(
        state.stores.jobs.get_job(principal.tenant, ident),
        state.stores.executions.latest_executions(ident, LATEST_EXECUTIONS),
        dependencies.parents_of(ident),
        dependencies.children_of(ident, LISTED_CHILDREN),
        dependencies.waiting_triggers(ident),
    )
    if job is None:
        raise not_found("job", shown_as)
    template = state.settings.trace_link
    cipher = await state.keyring.cipher(principal.tenant)
    view = render_job(job, cipher)
    view["latestExecutions"] = [render_execution(row, template, cipher) for row in executions]
    view["latestExecutionState"] = executions[0]["state"] if executions else None
    view["parents"] = [{**_relative(row), "waiting": waiting.get(row["job_id"], 0)} for row in parents]
    view["children"] = [_relative(row) for row in children]
    return OrjsonResponse(view, headers=etag(job))


def _relative(row: Record) -> dict[str, Any]:
    return {"jobId": str(row["job_id"]), "name": row["name"], "state": row["state"], "on": row["on_state"]}
