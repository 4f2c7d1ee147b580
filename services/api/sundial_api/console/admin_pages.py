"""The console's operator pages (admin sessions only): the cluster and the tenant registry.

* ``/ui/cluster`` — what ``GET /v1/admin/cluster`` answers: every replica with its roles and shards, each
  shard's leader, fence token (and the one Postgres recorded), lease TTL and hot-window size, the singleton roles.
* ``/ui/tenants`` — ``GET /v1/tenants``: weights, quotas and state of every tenant, with suspend and resume
  (``POST /v1/tenants/{id}/suspend|resume``, audited as the API audits them).

A session opened with a token without the admin claim gets the API's own 403.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.responses import RedirectResponse, Response

from sundial_api import admin, tenants
from sundial_api.console.answers import answer
from sundial_api.console.guard import ConsoleRoute, Signed, read_form
from sundial_api.console.render import page
from sundial_api.problems import ProblemError
from sundial_api.state import State

router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)

TenantId = Annotated[str, Path(max_length=64)]


@router.get("/cluster")
async def cluster_page(request: Request, state: State, session: Signed) -> Response:
    view = await answer(admin.cluster(request, state, session.principal))
    return page(request, "cluster.html", {"cluster": view}, live="cluster_live.html")


@router.get("/tenants")
async def tenants_page(request: Request, state: State, session: Signed) -> Response:
    listing = await answer(tenants.list_tenants(state, session.principal, limit=500, cursor=None))
    return page(request, "tenants.html", {"tenants": listing["items"]}, live="tenants_live.html")


@router.post("/tenants/{tenant_id}/{action}")
async def change_tenant(
    request: Request, state: State, session: Signed, tenant_id: TenantId, action: Annotated[str, Path(max_length=10)]
) -> Response:
    if (await read_form(request)).get("confirm") != "yes":
        raise ProblemError(422, "tick the confirmation box to change a tenant", errors=[{"field": "confirm",
                           "message": "is required"}])  # fmt: skip
    if action == "suspend":
        await tenants.suspend_tenant(tenant_id, state, session.principal)
    elif action == "resume":
        await tenants.resume_tenant(tenant_id, state, session.principal)
    else:
        raise ProblemError(404, f"no tenant action {action!r} (suspend or resume)")
    return RedirectResponse("/ui/tenants", status_code=303)
