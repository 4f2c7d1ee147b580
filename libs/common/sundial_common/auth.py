"""Bearer tokens: HS256 JWTs whose claims name the tenant (and whether the holder is an admin).

``sundial token --tenant demo`` mints one with the configured signing key; the API verifies it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from sundial_common.settings import CommonSettings, SettingsHelpParser

ISSUER = "sundial"
TENANT = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    subject: str
    admin: bool = False


class InvalidToken(Exception):
    pass


def issue_token(
    secret: str,
    tenant: str,
    *,
    subject: str | None = None,
    admin: bool = False,
    ttl_sec: int = 30 * 24 * 3600,
) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "sub": subject or f"{tenant}-service",
        "tenant": tenant,
        "iat": now,
        "exp": now + ttl_sec,
    }
    if admin:
        claims["admin"] = True
    return jwt.encode(claims, secret, algorithm="HS256")


def verify_token(secret: str, token: str) -> Principal:
    try:
        claims = jwt.decode(
            token, secret, algorithms=["HS256"], issuer=ISSUER, options={"require": ["exp", "iss", "sub"]}
        )
    except jwt.PyJWTError as exc:
        raise InvalidToken(str(exc)) from exc
    tenant = claims.get("tenant")
    if not isinstance(tenant, str) or not tenant:
        raise InvalidToken("token names no tenant")
    return Principal(tenant=tenant, subject=str(claims["sub"]), admin=claims.get("admin") is True)


def token_main(argv: list[str] | None = None) -> int:
    parser = SettingsHelpParser(
        prog="sundial token",
        description="Mint a bearer token for a tenant.",
        settings=CommonSettings,
        fields=("jwt_secret",),
    )
    parser.add_argument("--tenant", required=True, help="Tenant the token acts for.")
    parser.add_argument("--admin", action="store_true", help="Also grant the admin endpoints.")
    parser.add_argument("--ttl", type=int, default=30 * 24 * 3600, help="Lifetime in seconds (default 30 days).")
    parser.add_argument("--secret", default=None, help="Signing key (env SUNDIAL_JWT_SECRET).")
    args = parser.parse_args(argv)
    secret = args.secret or CommonSettings().jwt_secret
    print(issue_token(secret, args.tenant, admin=args.admin, ttl_sec=args.ttl))
    return 0
