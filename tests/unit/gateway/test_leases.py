"""Attempt tokens as the gateway issues them: the deadline and the retry backoff ride inside, under the HMAC, so a
worker can change neither, and a token is good for one execution, attempt and worker only — at any replica."""

from __future__ import annotations

import pytest
from sundial_common.security.auth import SymmetricKey
from sundial_common.security.pool_tokens import PoolGrant
from sundial_gateway import leases

KEY = SymmetricKey(None, "gateway-leases-unit-secret-0123456789ab")
GRANT = PoolGrant(token_id="pt_1", pool="mail", tenant="acme", subject="w", expires_at=0, ttl_sec=60)


def test_a_token_carries_its_terms_for_one_attempt_of_one_worker() -> None:
    worker = leases.worker_id(GRANT, "session-1")
    terms = leases.Terms(deadline_ms=1_800_000_000_000, retry_delay_ms=2500)
    token = leases.issue(KEY, "e1", 1, worker, terms)
    assert leases.check([KEY], token, "e1", 1, worker) == terms
    for execution, attempt, other in (
        ("e2", 1, worker),
        ("e1", 2, worker),
        ("e1", 1, leases.worker_id(GRANT, "session-2")),
    ):
        assert leases.check([KEY], token, execution, attempt, other) is None
    # Another token of the same pool is another worker: its callers cannot use this attempt.
    stranger = leases.worker_id(PoolGrant("pt_2", "mail", "acme", "w", 0, 60), "session-1")
    assert leases.check([KEY], token, "e1", 1, stranger) is None


def test_a_worker_cannot_move_its_deadline_or_its_backoff() -> None:
    worker = leases.worker_id(GRANT, "session-1")
    token = leases.issue(KEY, "e1", 1, worker, leases.Terms(1_800_000_000_000, 2500))
    _, _, mac = token.split(".")
    for forged in (f"1900000000000.2500.{mac}", f"1800000000000.0.{mac}", "0.0.x", "", "not a token"):
        assert leases.check([KEY], forged, "e1", 1, worker) is None


@pytest.mark.parametrize("bad", ["short", "has space in it", "x" * 65, "semi;colon1"])
def test_a_session_is_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="session"):
        leases.worker_id(GRANT, bad)
