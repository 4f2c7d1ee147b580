"""The console's SSO settings are checked where they are read, and SSO identities map to tenants as documented;
the next-fire cursor of the jobs list reads back what it wrote and names itself when it is not one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from starlette.requests import Request
from sundial_api.console.job_order import decode_cursor, encode_cursor
from sundial_api.console.sso import UntrustedIdentity, identity_of
from sundial_api.problems import ProblemError
from sundial_api.settings import ApiSettings

KEY = "k" * 40


def settings(**sso: object) -> ApiSettings:
    return ApiSettings(jwt_secret=KEY, **sso)  # type: ignore[arg-type]


def request(peer: str, **headers: str) -> Request:
    raw = [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/ui/sign-in", "headers": raw, "client": (peer, 1)})


def test_sso_settings_are_checked_where_they_are_read() -> None:
    with pytest.raises(ValueError, match="SUNDIAL_CONSOLE_SSO_PROXIES"):
        settings(console_sso_headers=["X-Forwarded-Email"])
    with pytest.raises(ValueError, match="not an address or network"):
        settings(console_sso_headers=["X-Forwarded-Email"], console_sso_proxies=["proxy"])
    with pytest.raises(ValueError, match="not a tenant"):
        settings(console_sso_identities={"a@b.example": "root:acme"})


def test_an_sso_identity_maps_to_a_tenant_or_an_operator_from_a_trusted_proxy_only() -> None:
    sso = settings(
        console_sso_headers=["X-Forwarded-Email", "X-Forwarded-User"],
        console_sso_proxies=["10.0.0.1", "fd00::/8"],
        console_sso_identities={"ops@a.example": "admin:acme", "@a.example": "acme"},
    )
    ops = identity_of(request("10.0.0.1", **{"X-Forwarded-Email": "ops@a.example"}), sso)
    assert ops is not None and (ops.principal.tenant, ops.principal.admin) == ("acme", True)
    user = identity_of(request("fd00::5", **{"X-Forwarded-User": "joe@A.example"}), sso)
    assert user is not None and (user.principal.tenant, user.principal.admin) == ("acme", False)
    assert identity_of(request("10.0.0.1"), sso) is None  # no header: the sign-in form
    with pytest.raises(UntrustedIdentity, match="trusted only"):
        identity_of(request("10.0.0.2", **{"X-Forwarded-Email": "ops@a.example"}), sso)
    with pytest.raises(UntrustedIdentity, match="no tenant"):
        identity_of(request("10.0.0.1", **{"X-Forwarded-Email": "ops@b.example"}), sso)
    # Off: the header means nothing, from anyone.
    assert identity_of(request("10.0.0.1", **{"X-Forwarded-Email": "ops@a.example"}), settings()) is None


def test_the_next_fire_cursor_reads_back_and_names_itself_when_wrong() -> None:
    ident = uuid.uuid4()
    at = datetime(2026, 5, 5, 10, 0, tzinfo=UTC)
    assert decode_cursor(encode_cursor(at, ident)) == (at, ident)
    assert decode_cursor(encode_cursor(None, ident)) == (None, ident)
    for bad in ("x", encode_cursor(at, ident)[:-4], "am9iczo"):
        with pytest.raises(ProblemError) as caught:
            decode_cursor(bad)
        assert caught.value.errors[0]["field"] == "cursor"
