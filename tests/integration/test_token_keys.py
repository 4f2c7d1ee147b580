"""Keys and tokens end to end: every Sundial process refuses the development key outside
SUNDIAL_ENV=dev, and the API accepts rotated kids, an identity provider's RS256 tokens from a JWKS, and refuses a
token for another audience."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI
from sundial_api.app import create_app
from sundial_api.settings import ApiSettings
from sundial_client.command import main as sundial
from sundial_common.security.auth import issue_token
from sundial_infra.supervisor import sundial_argv

from tests.support.tenants import tenant_token

OLD = "rotation-old-signing-key-0123456789abcdef"
NEW = "rotation-new-signing-key-0123456789abcdef"
#: Every service that holds a signing key. The worker verifies no token, so the development key is no reason for
#: it to refuse to start (a first worker runs from anywhere with no settings: tests/e2e/test_first_worker.py).
SERVICES = ("api", "dispatcher", "hydrator", "sweeper", "replayer", "analytics")


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_refuses_the_development_key_unless_sundial_env_is_dev(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process through the `sundial` front door (each main must refuse before touching any server; a
    # subprocess per service costs a Python start-up each). The real process start is the test below.
    monkeypatch.delenv("SUNDIAL_ENV")
    with pytest.raises(SystemExit) as exited:
        sundial([name])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, stderr
    assert "SUNDIAL_JWT_SECRET is the built-in development signing key" in stderr
    assert "Set SUNDIAL_JWT_SECRET to a random key of at least 32 bytes" in stderr and "SUNDIAL_ENV=dev" in stderr
    monkeypatch.setenv("SUNDIAL_JWT_SECRET", "too-short")
    with pytest.raises(SystemExit):
        sundial([name])
    assert "SUNDIAL_JWT_SECRET is 9 bytes: an HS256 key needs at least 32" in capsys.readouterr().err


def test_the_api_process_refuses_the_development_key_and_sundial_token_mints_in_dev_only() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUNDIAL_")}
    api = subprocess.Popen([*sundial_argv("api")], env=env, stderr=subprocess.PIPE, text=True)
    refused = subprocess.run([*sundial_argv("token", "--tenant", "demo")], env=env, capture_output=True, text=True)
    dev = subprocess.run(
        [*sundial_argv("token", "--tenant", "demo")], env={**env, "SUNDIAL_ENV": "dev"}, capture_output=True, text=True
    )
    _, stderr = api.communicate(timeout=120)
    assert api.returncode == 2 and "development signing key" in stderr and "Traceback" not in stderr, stderr
    assert refused.returncode == 2 and "development signing key" in refused.stderr
    assert dev.returncode == 0, dev.stderr
    assert jwt.decode(dev.stdout.strip(), options={"verify_signature": False})["aud"] == "sundial"


async def _serve(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api.test") as client,
    ):
        yield client


@pytest.fixture
def idp_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
async def client(
    database_url: str, redis_url: str, tmp_path: Path, idp_key: rsa.RSAPrivateKey
) -> AsyncIterator[httpx.AsyncClient]:
    jwks = tmp_path / "jwks.json"
    public = jwt.algorithms.RSAAlgorithm.to_jwk(idp_key.public_key(), as_dict=True)
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "idp-1", "use": "sig"}]}))
    settings = ApiSettings(
        env="production",
        database_url=database_url,
        redis_url=redis_url,
        jwt_keys={"k2": NEW, "k1": OLD},
        jwks_url=str(jwks),
        jwt_issuers=["sundial", "https://idp.example"],
    )
    tenant_token(database_url, "acme", secret=NEW)  # registers acme
    async for served in _serve(create_app(settings)):
        yield served


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_the_api_verifies_rotated_kids_and_an_identity_providers_tokens_and_checks_aud(
    client: httpx.AsyncClient, idp_key: rsa.RSAPrivateKey
) -> None:
    for token in (issue_token(NEW, "acme", kid="k2"), issue_token(OLD, "acme", kid="k1")):
        assert (await client.get("/v1/jobs", headers=bearer(token))).status_code == 200

    claims = {"iss": "https://idp.example", "sub": "alice@acme", "aud": "sundial", "tenant": "acme"}
    rs256 = jwt.encode({**claims, "exp": int(time.time()) + 60}, idp_key, algorithm="RS256", headers={"kid": "idp-1"})
    assert (await client.get("/v1/jobs", headers=bearer(rs256))).status_code == 200

    wrong_aud = await client.get("/v1/jobs", headers=bearer(issue_token(NEW, "acme", kid="k2", audience="billing")))
    assert wrong_aud.status_code == 401
    assert "wrong audience" in wrong_aud.json()["detail"]
    unknown = await client.get("/v1/jobs", headers=bearer(issue_token(NEW, "acme", kid="k0")))
    assert unknown.status_code == 401 and "unknown key id" in unknown.json()["detail"]
