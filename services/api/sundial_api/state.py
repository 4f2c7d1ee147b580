"""What one API process holds for its whole life: settings, the Postgres stores, the Redis hot window, the clock,
the tenant and pool registry caches, the pools' live workers.

Built once by the app's lifespan and reached by handlers through :func:`get_state`, so no request opens a
connection pool of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sundial_common.hotwindow.rate_limits import TokenBuckets
from sundial_common.hotwindow.window import HotWindow
from sundial_common.hotwindow.worker_announcements import LiveWorkersCache
from sundial_common.runtime.clock import Clock
from sundial_common.security.auth import TokenVerifier
from sundial_common.security.encryption import Keyring
from sundial_common.stores import Stores
from sundial_common.stores.pool_cache import PoolCache

from sundial_api.change_feed import ChangeFeed
from sundial_api.group_commit import CreateGroups
from sundial_api.notification_delivery import NotificationDelivery
from sundial_api.settings import ApiSettings
from sundial_api.tenant_cache import TenantCache
from sundial_api.tokens import VerifiedTokens


@dataclass(frozen=True, slots=True)
class ApiState:
    settings: ApiSettings
    stores: Stores
    hot_window: HotWindow
    clock: Clock
    tenant_cache: TenantCache
    #: Per-tenant rate quotas (maxCreatesPerSec), over the hot window's Redis.
    buckets: TokenBuckets
    #: Tenants' data keys: payloads, results, progress, errors and stored responses are sealed with them.
    keyring: Keyring
    #: The keys, audience and issuers a bearer token is checked against (JWKS cached here).
    verifier: TokenVerifier
    #: The pool registry, as the checks of every create, target change, trigger and replay read it.
    pool_cache: PoolCache
    #: Concurrent single creates, written together (:mod:`sundial_api.group_commit`).
    create_groups: CreateGroups
    #: Which tenants' data changed lately, for the console's live regions (:mod:`sundial_api.change_feed`).
    changes: ChangeFeed
    #: Which workers are alive in which pool (their announcements, read at most a second ago): the pool view, an
    #: execution's `waitingFor` and a job's warnings.
    live_workers: LiveWorkersCache
    #: The replica's share of the notification deliveries and its outbound sender
    #: (:mod:`sundial_api.notification_delivery`).
    notifications: NotificationDelivery
    verified_tokens: VerifiedTokens = field(default_factory=VerifiedTokens)


async def get_state(request: Request) -> ApiState:
    # ``async`` on purpose: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop per
    # request for a dictionary lookup.
    state: ApiState = request.app.state.api
    return state


State = Annotated[ApiState, Depends(get_state)]
