"""Pool tokens and attempt tokens: each kind of token is refused where the other belongs, an expired or forged one
is refused with a reason, and an attempt token fits exactly one execution, attempt and session."""

from __future__ import annotations

import time

import pytest
from sundial_common.security.auth import InvalidToken, SymmetricKey, TokenVerifier, issue_token
from sundial_common.security.pool_tokens import (
    PoolTokenVerifier,
    attempt_token,
    attempt_token_valid,
    issue_pool_token,
)

KEY = SymmetricKey("k2", "pool-token-unit-secret-0123456789abcdef")
OLD = SymmetricKey("k1", "pool-token-unit-old-secret-0123456789ab")


def pool_token(key: SymmetricKey = KEY, **overrides: object) -> str:
    fields: dict[str, object] = {"token_id": "pt_1", "pool": "mail", "tenant": "acme", "subject": "w", "ttl_sec": 60}
    fields.update(overrides)
    return issue_pool_token(key, **fields)  # type: ignore[arg-type]


def test_a_pool_token_says_its_pool_tenant_and_registry_id() -> None:
    grant = PoolTokenVerifier([KEY, OLD]).verify(pool_token())
    assert (grant.token_id, grant.pool, grant.tenant, grant.subject, grant.ttl_sec) == ("pt_1", "mail", "acme", "w", 60)
    assert grant.expires_at - time.time() == pytest.approx(60, abs=2)
    # Signed by a key being rotated out: still good while it verifies.
    assert PoolTokenVerifier([KEY, OLD]).verify(pool_token(OLD)).pool == "mail"


def test_the_gateway_refuses_tenant_and_admin_tokens() -> None:
    for admin in (False, True):
        tenant = issue_token(KEY.secret, "acme", admin=admin, kid=KEY.kid)
        with pytest.raises(InvalidToken, match="not a pool token"):
            PoolTokenVerifier([KEY]).verify(tenant)
        # Even one given the pool tokens' audience lacks their type.
        sneaky = issue_token(KEY.secret, "acme", admin=admin, kid=KEY.kid, audience="sundial-worker")
        with pytest.raises(InvalidToken, match="not a pool token"):
            PoolTokenVerifier([KEY]).verify(sneaky)


async def test_the_api_refuses_pool_tokens_whatever_its_audience() -> None:
    with pytest.raises(InvalidToken, match="audience"):
        await TokenVerifier([KEY]).verify(pool_token())
    with pytest.raises(InvalidToken, match="worker gateway"):
        await TokenVerifier([KEY], audience="sundial-worker").verify(pool_token())


def test_expired_forged_and_unknown_key_pool_tokens_are_refused() -> None:
    verifier = PoolTokenVerifier([KEY], leeway_sec=0)
    with pytest.raises(InvalidToken, match="expired"):
        verifier.verify(pool_token(now=time.time() - 120))
    with pytest.raises(InvalidToken, match="Signature"):
        verifier.verify(pool_token(SymmetricKey("k2", "another-secret-of-enough-length-0123456")))
    with pytest.raises(InvalidToken, match="unknown key id"):
        verifier.verify(pool_token(OLD))
    with pytest.raises(InvalidToken, match="malformed"):
        verifier.verify("not.a.jwt")


def test_an_attempt_token_fits_one_execution_attempt_and_session() -> None:
    token = attempt_token(KEY, "e1", 2, "s1")
    assert len(token) >= 40 and token != attempt_token(KEY, "e1", 2, "s2")
    assert attempt_token_valid([KEY], token, "e1", 2, "s1")
    assert attempt_token_valid(
        [SymmetricKey("k3", "newer-secret-of-enough-length-01234567"), KEY], token, "e1", 2, "s1"
    )
    for execution, attempt, session in (("e2", 2, "s1"), ("e1", 3, "s1"), ("e1", 2, "s2")):
        assert not attempt_token_valid([KEY], token, execution, attempt, session)
    assert not attempt_token_valid([KEY], token[:-1] + ("A" if token[-1] != "A" else "B"), "e1", 2, "s1")
    assert not attempt_token_valid([OLD], token, "e1", 2, "s1")
