"""Pool tokens over the API: who may mint them (an admin, or an owned pool's owner; a shared pool's only through an
admin, naming one of its tenants), what a minted one says, that the API refuses them as bearer tokens, and
revocation. The worker gateway's side (checking them on use) is tested with the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_common.security.auth import SymmetricKey, issue_token
from sundial_common.security.pool_tokens import PoolTokenVerifier

from tests.support.pools import admit
from tests.support.tenants import tenant_token

SECRET = "pool-tokens-test-secret-0123456789abc"


@pytest.fixture
async def client(database_url: str, redis_url: str, kafka_bootstrap: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(
        database_url=database_url, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap, jwt_secret=SECRET, shards=2
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as http,
    ):
        yield http


def bearer(database_url: str, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant_token(database_url, tenant, secret=SECRET)}"}


@pytest.fixture
def admin(database_url: str) -> dict[str, str]:
    tenant_token(database_url, "ops", secret=SECRET)  # registers the admin's own tenant
    return {"Authorization": f"Bearer {issue_token(SECRET, 'ops', admin=True, subject='ops-alice')}"}


async def test_owner_mints_a_token_the_gateway_accepts_and_the_api_refuses(
    client: httpx.AsyncClient, database_url: str, admin: dict[str, str]
) -> None:
    owner = bearer(database_url, "acme")
    admit(database_url, "acme-mail", "acme")
    minted = await client.post("/v1/pools/acme-mail/tokens", json={"ttlSec": 600}, headers=owner)
    assert minted.status_code == 201, minted.text
    body = minted.json()
    assert body["pool"] == "acme-mail" and body["tenant"] == "acme" and body["ttlSec"] == 600
    assert body["subject"] == "acme-mail-worker" and body["revokedAt"] is None
    assert minted.headers["Cache-Control"] == "no-store"
    grant = PoolTokenVerifier([SymmetricKey(None, SECRET)]).verify(body["token"])
    assert (grant.pool, grant.tenant, grant.token_id, grant.ttl_sec) == ("acme-mail", "acme", body["id"], 600)

    # A pool token is no key to the API, not even to read.
    as_worker = {"Authorization": f"Bearer {body['token']}"}
    refused = await client.get("/v1/jobs", headers=as_worker)
    assert refused.status_code == 401 and "audience" in refused.json()["detail"], refused.text

    listed = await client.get("/v1/pools/acme-mail/tokens", headers=owner)
    assert [t["id"] for t in listed.json()["items"]] == [body["id"]] and "token" not in listed.json()["items"][0]

    revoked = await client.delete(f"/v1/pools/acme-mail/tokens/{body['id']}", headers=owner)
    again = await client.delete(f"/v1/pools/acme-mail/tokens/{body['id']}", headers=owner)
    assert revoked.status_code == again.status_code == 204
    listed = await client.get("/v1/pools/acme-mail/tokens", headers=admin)
    assert listed.json()["items"][0]["revokedAt"] is not None
    unknown = await client.delete("/v1/pools/acme-mail/tokens/pt_nope", headers=owner)
    assert unknown.status_code == 404 and "pt_nope" in unknown.json()["detail"]


async def test_only_an_admin_mints_for_a_shared_pool_and_names_one_of_its_tenants(
    client: httpx.AsyncClient, database_url: str, admin: dict[str, str]
) -> None:
    a, b = bearer(database_url, "share-a"), bearer(database_url, "share-b")
    admit(database_url, "shared-work", "share-a", "share-b")
    admit(database_url, "b-own", "share-b")

    for headers in (a, b):
        refused = await client.post("/v1/pools/shared-work/tokens", json={"tenant": "share-a"}, headers=headers)
        assert refused.status_code == 403 and "only an admin" in refused.json()["detail"], refused.text
    # Another tenant's pool: refused, and no more said of it than of a pool that does not exist.
    others = await client.post("/v1/pools/b-own/tokens", json={}, headers=a)
    missing = await client.post("/v1/pools/no-such-pool/tokens", json={}, headers=a)
    assert others.status_code == missing.status_code == 403
    assert others.json()["detail"].replace("b-own", "X") == missing.json()["detail"].replace("no-such-pool", "X")
    listing = await client.get("/v1/pools/b-own/tokens", headers=a)
    revoking = await client.delete("/v1/pools/b-own/tokens/pt_x", headers=a)
    assert listing.status_code == revoking.status_code == 403

    unnamed = await client.post("/v1/pools/shared-work/tokens", json={}, headers=admin)
    outsider = await client.post("/v1/pools/shared-work/tokens", json={"tenant": "share-c"}, headers=admin)
    for response in (unnamed, outsider):
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["field"] == "tenant"
    wrong_owner = await client.post("/v1/pools/b-own/tokens", json={"tenant": "share-a"}, headers=admin)
    assert wrong_owner.status_code == 422 and wrong_owner.json()["errors"][0]["field"] == "tenant"
    bad_ttl = await client.post("/v1/pools/b-own/tokens", json={"ttlSec": 5}, headers=admin)
    assert bad_ttl.status_code == 422 and "ttlSec" in bad_ttl.text
    absent = await client.post("/v1/pools/no-such-pool/tokens", json={}, headers=admin)
    assert absent.status_code == 404

    minted = await client.post("/v1/pools/shared-work/tokens", json={"tenant": "share-b"}, headers=admin)
    assert minted.status_code == 201, minted.text
    assert minted.json()["tenant"] == "share-b" and minted.json()["createdBy"] == "ops-alice"


async def test_staging_pools_get_no_tokens(client: httpx.AsyncClient, database_url: str) -> None:
    owner = bearer(database_url, "stager")
    admit(database_url, "stager-staging", "stager", kind="staging")
    refused = await client.post("/v1/pools/stager-staging/tokens", json={}, headers=owner)
    assert refused.status_code == 422 and "staging" in refused.json()["detail"], refused.text
