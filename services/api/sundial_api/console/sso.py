"""Single sign-on behind a trusted proxy: the console takes the user's identity from a header an SSO proxy sets.

Off unless ``SUNDIAL_CONSOLE_SSO_HEADERS`` names the identity headers (e.g. ``X-Forwarded-Email``, as
oauth2-proxy sets it). Such a header is believed only when the connection's peer is one of
``SUNDIAL_CONSOLE_SSO_PROXIES``: anyone else could type it, so from another peer it is refused (403), never
taken. The identity signs in as what ``SUNDIAL_CONSOLE_SSO_IDENTITIES`` maps it to — a tenant, or ``admin:`` and
a tenant — by its exact name or, for an address, by ``@`` and its domain; an identity not mapped may not sign in.

A session opened so is marked with its identity; when the proxy later sends another identity on the same cookie
(someone else signed in at the proxy), that session ends. Everything else about it is a session like any other:
server-side, ended by sign-out, by its tenant's suspension, and after :data:`SSO_SESSION_SEC`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.requests import Request
from sundial_common.security.auth import Principal

from sundial_api.settings import ApiSettings

#: How long an SSO session lasts (the proxy signs the user in again when it has to).
SSO_SESSION_SEC = 8 * 3600
#: The longest identity taken from a header.
MAX_IDENTITY_CHARS = 320


class UntrustedIdentity(Exception):
    """An identity header from a peer that is not a trusted proxy, or one that maps to no tenant."""


@dataclass(frozen=True, slots=True)
class SsoIdentity:
    """Who the proxy says the user is, and what the console lets them act as."""

    name: str
    principal: Principal


def _peer_trusted(request: Request, settings: ApiSettings) -> bool:
    host = request.client.host if request.client is not None else ""
    try:
        peer = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(peer in ipaddress.ip_network(proxy, strict=False) for proxy in settings.console_sso_proxies)


def _claimed(request: Request, settings: ApiSettings) -> str | None:
    for header in settings.console_sso_headers:
        value = request.headers.get(header, "").strip()
        if value:
            return value
    return None


def _role(name: str, settings: ApiSettings) -> str | None:
    identities = settings.console_sso_identities
    if name in identities:
        return identities[name]
    _, at, domain = name.rpartition("@")
    return identities.get(f"@{domain.lower()}") if at else None


def identity_of(request: Request, settings: ApiSettings) -> SsoIdentity | None:
    """The SSO identity of the request: None when SSO is off or no identity header came; raises
    :class:`UntrustedIdentity` for a header from an untrusted peer, or an identity no tenant is mapped to."""
    name = _claimed(request, settings) if settings.console_sso_headers else None
    if name is None:
        return None
    if not _peer_trusted(request, settings):
        raise UntrustedIdentity("identity headers are trusted only from the configured SSO proxies")
    if len(name) > MAX_IDENTITY_CHARS or any(ord(c) < 32 for c in name):
        raise UntrustedIdentity("the SSO identity header is malformed")
    role = _role(name, settings)
    if role is None:
        raise UntrustedIdentity(f"{name} may not sign in here: no tenant is mapped to this identity")
    admin, _, tenant = role.rpartition(":")
    return SsoIdentity(name, Principal(tenant=tenant, subject=f"sso:{name}", admin=admin == "admin"))


def is_sso_subject(subject: str) -> bool:
    """The session was opened by SSO (its subject is ``sso:<identity>``)."""
    return subject.startswith("sso:")


def same_user(request: Request, settings: ApiSettings, subject: str) -> bool:
    """An SSO session's request still comes as its own identity: False when the proxy now names someone else (or
    an identity header came from an untrusted peer); a request with no identity header is left as it is."""
    try:
        current = identity_of(request, settings)
    except UntrustedIdentity:
        return False
    return current is None or current.principal.subject == subject
