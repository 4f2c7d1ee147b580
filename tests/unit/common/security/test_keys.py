"""Signing keys and bearer tokens: the development key refused outside SUNDIAL_ENV=dev, short keys
refused, several keys by ``kid`` for rotation, RS256/ES256 keys from a JWKS file, ``aud`` required, clock-skew
leeway. (That every process refuses the key at start is tests/integration/test_token_keys.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import ValidationError
from sundial_common.runtime.settings import DEV_SIGNING_KEY, CommonSettings
from sundial_common.security.auth import InvalidToken, Jwks, SymmetricKey, TokenVerifier, issue_token, symmetric_keys

OLD = "an-old-signing-key-of-at-least-32-bytes!"
NEW = "the-new-signing-key-of-at-least-32-bytes"


def test_the_development_key_is_refused_outside_dev_with_a_hint() -> None:
    with pytest.raises(ValidationError) as refused:
        CommonSettings(env="production")
    message = str(refused.value)
    assert "SUNDIAL_JWT_SECRET is the built-in development signing key" in message
    assert "SUNDIAL_ENV=dev" in message and "secrets.token_urlsafe" in message
    with pytest.raises(ValidationError, match="development signing key"):
        CommonSettings(env="production", jwt_keys={"k1": DEV_SIGNING_KEY})
    assert CommonSettings(env="dev").jwt_secret == DEV_SIGNING_KEY
    assert CommonSettings(env="production", jwt_secret=NEW).jwt_secret == NEW


def test_keys_shorter_than_32_bytes_are_refused() -> None:
    with pytest.raises(ValidationError, match="SUNDIAL_JWT_SECRET is 31 bytes"):
        CommonSettings(env="dev", jwt_secret="x" * 31)
    with pytest.raises(ValidationError, match=r"SUNDIAL_JWT_KEYS\['k2'\] is 5 bytes"):
        CommonSettings(env="production", jwt_keys={"k1": NEW, "k2": "short"})
    with pytest.raises(ValidationError, match="not both"):
        CommonSettings(env="production", jwt_secret=NEW, jwt_keys={"k1": NEW})
    # JWKS only: no HS256 key at all is allowed (the API then needs SUNDIAL_JWKS_URL).
    assert symmetric_keys(CommonSettings(env="production", jwt_secret="")) == ()


async def test_rotation_old_kid_tokens_verify_while_the_old_key_is_configured() -> None:
    before = TokenVerifier([SymmetricKey("k1", OLD)])
    during = TokenVerifier.from_settings(CommonSettings(env="production", jwt_keys={"k2": NEW, "k1": OLD}))
    after = TokenVerifier([SymmetricKey("k2", NEW)])
    old_token = issue_token(OLD, "acme", kid="k1")
    new_token = issue_token(NEW, "acme", kid="k2")
    legacy_token = issue_token(OLD, "acme")  # minted before kids: tried against every HS256 key

    assert (await before.verify(old_token)).tenant == "acme"
    for token in (old_token, new_token, legacy_token):
        assert (await during.verify(token)).tenant == "acme"
    assert symmetric_keys(CommonSettings(env="production", jwt_keys={"k2": NEW, "k1": OLD}))[0].kid == "k2"
    with pytest.raises(InvalidToken, match="unknown key id 'k1'"):
        await after.verify(old_token)
    with pytest.raises(InvalidToken, match="Signature verification failed"):
        await after.verify(legacy_token)
    # A kid names one key: a token signed with another key under that kid is refused.
    with pytest.raises(InvalidToken, match="Signature"):
        await during.verify(issue_token(OLD, "acme", kid="k2"))


async def test_audience_is_required_and_checked_and_expiry_has_a_small_leeway() -> None:
    verifier = TokenVerifier([SymmetricKey(None, NEW)], audience="sundial", leeway_sec=30)
    with pytest.raises(InvalidToken, match="audience"):
        await verifier.verify(issue_token(NEW, "acme", audience="another-service"))
    now = int(time.time())
    no_aud = jwt.encode({"iss": "sundial", "sub": "s", "tenant": "acme", "exp": now + 60}, NEW, algorithm="HS256")
    with pytest.raises(InvalidToken, match="aud"):
        await verifier.verify(no_aud)
    # Expired 10 s ago: within the 30 s leeway (another machine's clock); 60 s ago: refused.
    assert (await verifier.verify(issue_token(NEW, "acme", ttl_sec=-10))).tenant == "acme"
    with pytest.raises(InvalidToken, match="expired"):
        await verifier.verify(issue_token(NEW, "acme", ttl_sec=-60))
    with pytest.raises(InvalidToken, match="algorithm 'none'"):
        await verifier.verify(jwt.encode({"sub": "s"}, "", algorithm="none"))
    with pytest.raises(ValidationError):
        CommonSettings(env="dev", jwt_leeway_sec=3600)


def _jwk(public_key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey, kid: str) -> dict[str, object]:
    if isinstance(public_key, rsa.RSAPublicKey):
        data = jwt.algorithms.RSAAlgorithm.to_jwk(public_key, as_dict=True)
    else:
        data = jwt.algorithms.ECAlgorithm.to_jwk(public_key, as_dict=True)
    return {**data, "kid": kid, "use": "sig"}


async def test_an_identity_providers_rs256_and_es256_tokens_verify_from_a_jwks_file(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps({"keys": [_jwk(rsa_key.public_key(), "idp-rsa")]}))
    jwks = Jwks(str(jwks_file), refresh_sec=300, min_refresh_sec=0)
    verifier = TokenVerifier([], jwks=jwks, issuers=["sundial", "https://idp.example"])
    claims: dict[str, object] = {"iss": "https://idp.example", "sub": "alice@acme", "aud": "sundial", "tenant": "acme"}
    claims["exp"] = int(time.time()) + 60

    rs256 = jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": "idp-rsa"})
    principal = await verifier.verify(rs256)
    assert (principal.tenant, principal.subject) == ("acme", "alice@acme")

    # The provider rotates: a new kid appears in the document and is fetched on first sight.
    es256 = jwt.encode(claims, ec_key, algorithm="ES256", headers={"kid": "idp-ec"})
    jwks_file.write_text(
        json.dumps({"keys": [_jwk(rsa_key.public_key(), "idp-rsa"), _jwk(ec_key.public_key(), "idp-ec")]})
    )
    assert (await verifier.verify(es256)).subject == "alice@acme"

    # Algorithm confusion: an HS256 token "signed" with the public key's text is not checked against it.
    with pytest.raises(InvalidToken, match="unknown key id 'idp-rsa'"):
        await verifier.verify(jwt.encode(claims, "x" * 32, algorithm="HS256", headers={"kid": "idp-rsa"}))
    with pytest.raises(InvalidToken, match="unknown issuer"):
        await verifier.verify(
            jwt.encode(
                {**claims, "iss": "https://evil.example"}, rsa_key, algorithm="RS256", headers={"kid": "idp-rsa"}
            )
        )
    with pytest.raises(InvalidToken, match="unknown key id 'gone'"):
        await verifier.verify(jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": "gone"}))
    # Without a JWKS, asymmetric tokens are refused outright.
    with pytest.raises(InvalidToken, match="no SUNDIAL_JWKS_URL"):
        await TokenVerifier([SymmetricKey(None, NEW)]).verify(rs256)
