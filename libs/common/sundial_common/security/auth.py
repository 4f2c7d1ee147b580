"""Bearer tokens: JWTs whose claims name the tenant (and whether the holder is an admin), and their keys.

Two kinds of keys verify a token, chosen by the token's ``alg`` header:

* **HS256 keys** shared with whoever mints tokens (``sundial token``): ``SUNDIAL_JWT_SECRET`` (one key, tokens
  carry no ``kid``) or ``SUNDIAL_JWT_KEYS`` (several, each with a ``kid``, newest first: the first signs, every
  one verifies — add a new key in front, restart, and drop the old one once its tokens have expired: rotation
  without downtime). A token with a ``kid`` is checked against that key only; one without (minted before kids)
  against each HS256 key in turn.
* **RS256/ES256 public keys** from a JWKS document (``SUNDIAL_JWKS_URL``, a URL or a file), so an external
  identity provider can issue tenant tokens without sharing a secret with Sundial (:class:`Jwks`).

Every token must carry ``exp``, ``iss`` (one of ``SUNDIAL_JWT_ISSUERS``), ``sub`` and ``aud`` (must be
``SUNDIAL_JWT_AUDIENCE``); ``SUNDIAL_JWT_LEEWAY_SEC`` tolerates a small clock skew on ``exp``/``iat``/``nbf``.

The built-in development key (``settings.DEV_SIGNING_KEY``) is public, so
:class:`~sundial_common.runtime.settings.CommonSettings` refuses it unless ``SUNDIAL_ENV=dev``, and refuses any HS256
key
shorter than 32 bytes: every process, not only the API, so a deployment that forgot its key fails at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt

from sundial_common.runtime.settings import CommonSettings, SettingsHelpParser, load_settings

log = logging.getLogger(__name__)

ISSUER = "sundial"
AUDIENCE = "sundial"
TENANT = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ASYMMETRIC_ALGORITHMS = ("RS256", "ES256")


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    subject: str
    admin: bool = False


class InvalidToken(Exception):
    pass


class MalformedToken(InvalidToken):
    """Not a JWT at all (its parts do not decode): said plainly, without the decoder's words."""

    def __init__(self) -> None:
        super().__init__("malformed bearer token")


@dataclass(frozen=True, slots=True)
class SymmetricKey:
    """One HS256 key; ``kid`` None for the single ``SUNDIAL_JWT_SECRET`` (its tokens carry no ``kid``)."""

    kid: str | None
    secret: str


def symmetric_keys(settings: CommonSettings) -> tuple[SymmetricKey, ...]:
    """The configured HS256 keys, newest (signing) first; empty when tokens come only from a JWKS."""
    if settings.jwt_keys:
        return tuple(SymmetricKey(kid, secret) for kid, secret in settings.jwt_keys.items())
    return (SymmetricKey(None, settings.jwt_secret),) if settings.jwt_secret else ()


def issue_token(
    secret: str,
    tenant: str,
    *,
    subject: str | None = None,
    admin: bool = False,
    ttl_sec: int = 30 * 24 * 3600,
    kid: str | None = None,
    audience: str = AUDIENCE,
) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "sub": subject or f"{tenant}-service",
        "aud": audience,
        "tenant": tenant,
        "iat": now,
        "exp": now + ttl_sec,
    }
    if admin:
        claims["admin"] = True
    return jwt.encode(claims, secret, algorithm="HS256", headers={"kid": kid} if kid else None)


class Jwks:
    """Public keys of a JWKS document (a URL or a file), cached and refreshed.

    The document is read at first use and again every ``refresh_sec``; a token naming a ``kid`` the cache
    does not know triggers an early re-read (the provider rotated), at most once per ``min_refresh_sec`` so a
    flood of made-up kids cannot turn every request into a fetch. A failed fetch keeps the keys already known.
    """

    def __init__(
        self, source: str, *, refresh_sec: float = 300.0, min_refresh_sec: float = 10.0, timeout_sec: float = 5.0
    ) -> None:
        self.source = source
        self.refresh_sec = refresh_sec
        self.min_refresh_sec = min_refresh_sec
        self.timeout_sec = timeout_sec
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None) -> jwt.PyJWK | None:
        now = time.monotonic()
        stale = self._fetched_at is None or now - self._fetched_at >= self.refresh_sec
        unknown = kid not in self._keys and (self._fetched_at is None or now - self._fetched_at >= self.min_refresh_sec)
        if stale or unknown:
            async with self._lock:
                if self._fetched_at is None or time.monotonic() - self._fetched_at >= self.min_refresh_sec:
                    await self.refresh()
        if kid is None:  # a provider with a single key may omit kids
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    async def refresh(self) -> None:
        self._fetched_at = time.monotonic()
        try:
            document = await self._read()
            keys = {}
            for data in document.get("keys", []):
                if data.get("use", "sig") != "sig" or "kid" not in data:
                    continue
                try:
                    key = jwt.PyJWK(data)
                except jwt.PyJWTError:
                    continue  # a key type or curve this process cannot use: the others still serve
                if key.algorithm_name in ASYMMETRIC_ALGORITHMS:
                    keys[str(data["kid"])] = key
        except (OSError, httpx.HTTPError, ValueError) as exc:
            log.warning("JWKS %s could not be read (%s); keeping the %d keys known", self.source, exc, len(self._keys))
            return
        self._keys = keys

    async def _read(self) -> dict[str, Any]:
        if self.source.startswith(("http://", "https://")):
            async with httpx.AsyncClient(timeout=self.timeout_sec) as client:
                response = await client.get(self.source)
                response.raise_for_status()
                document = response.json()
        else:
            path = Path(self.source.removeprefix("file://"))
            document = json.loads(await asyncio.to_thread(path.read_text))
        if not isinstance(document, dict):
            raise ValueError("a JWKS document is a JSON object with `keys`")
        return document


class TokenVerifier:
    """Checks a bearer token against the configured keys, audience, issuers and leeway; see the module docstring."""

    def __init__(
        self,
        keys: Sequence[SymmetricKey],
        *,
        jwks: Jwks | None = None,
        audience: str = AUDIENCE,
        issuers: Sequence[str] = (ISSUER,),
        leeway_sec: float = 30.0,
        tenant_claim: str = "tenant",
    ) -> None:
        self.keys = tuple(keys)
        self.jwks = jwks
        self.audience = audience
        self.issuers = list(issuers)
        self.leeway_sec = leeway_sec
        self.tenant_claim = tenant_claim

    @classmethod
    def from_settings(cls, settings: CommonSettings) -> TokenVerifier:
        jwks = Jwks(settings.jwks_url, refresh_sec=settings.jwks_refresh_sec) if settings.jwks_url else None
        return cls(
            symmetric_keys(settings),
            jwks=jwks,
            audience=settings.jwt_audience,
            issuers=settings.jwt_issuers,
            leeway_sec=settings.jwt_leeway_sec,
            tenant_claim=settings.jwt_tenant_claim,
        )

    async def verify(self, token: str) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise MalformedToken from exc
        algorithm, kid = header.get("alg"), header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("`kid` is not a string")
        candidates: list[Any]
        if algorithm == "HS256":
            candidates = [key.secret for key in self.keys if kid is None or key.kid == kid]
            if not candidates:
                raise InvalidToken(f"unknown key id {kid!r}" if kid is not None else "no HS256 key is configured")
        elif algorithm in ASYMMETRIC_ALGORITHMS:
            if self.jwks is None:
                raise InvalidToken(f"{algorithm} tokens are not accepted here (no SUNDIAL_JWKS_URL)")
            public = await self.jwks.key(kid)
            if public is None:
                raise InvalidToken(f"unknown key id {kid!r}")
            if public.algorithm_name != algorithm:  # a key is used only with its own algorithm
                raise InvalidToken(f"key {kid!r} is not an {algorithm} key")
            candidates = [public.key]
        else:
            raise InvalidToken(f"algorithm {algorithm!r} is not accepted")
        claims = self._decode(token, str(algorithm), candidates)
        if claims.get("typ") == "pool":  # even where an operator gave the API the pool tokens' audience
            raise InvalidToken("a pool token is for the worker gateway, not this API")
        tenant = claims.get(self.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise InvalidToken("token names no tenant")
        return Principal(tenant=tenant, subject=str(claims["sub"]), admin=claims.get("admin") is True)

    def _decode(self, token: str, algorithm: str, keys: list[Any]) -> Mapping[str, Any]:
        failure: jwt.PyJWTError | None = None
        for key in keys:
            try:
                return jwt.decode(
                    token,
                    key,
                    algorithms=[algorithm],
                    audience=self.audience,
                    issuer=self.issuers,
                    leeway=self.leeway_sec,
                    options={"require": ["exp", "iss", "sub", "aud"]},
                )
            except jwt.InvalidSignatureError as exc:  # maybe another key of a kid-less token
                failure = exc
            except jwt.InvalidAudienceError as exc:
                raise InvalidToken(f"wrong audience: `aud` must be {self.audience!r}") from exc
            except jwt.InvalidIssuerError as exc:
                raise InvalidToken(f"unknown issuer: `iss` must be one of {self.issuers}") from exc
            except jwt.DecodeError as exc:  # the claims' part does not decode
                raise MalformedToken from exc
            except jwt.PyJWTError as exc:
                raise InvalidToken(str(exc)) from exc
        raise InvalidToken(str(failure))


def token_main(argv: list[str] | None = None) -> int:
    parser = SettingsHelpParser(
        prog="sundial token",
        description="Mint a bearer token for a tenant, signed with the newest HS256 key (SUNDIAL_JWT_KEYS' first, "
        "else SUNDIAL_JWT_SECRET; the development key needs SUNDIAL_ENV=dev).",
        settings=CommonSettings,
        fields=("env", "jwt_secret", "jwt_keys", "jwt_audience"),
    )
    parser.add_argument("--tenant", required=True, help="Tenant the token acts for.")
    parser.add_argument("--admin", action="store_true", help="Also grant the admin endpoints.")
    parser.add_argument("--ttl", type=int, default=30 * 24 * 3600, help="Lifetime in seconds (default 30 days).")
    parser.add_argument("--subject", default=None, help="The token's `sub`, its holder (default <tenant>-service).")
    parser.add_argument("--secret", default=None, help="Signing key (env SUNDIAL_JWT_SECRET).")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"jwt_secret": args.secret, "jwt_keys": {}} if args.secret is not None else {}
    settings = load_settings(CommonSettings, parser, **overrides)
    keys = symmetric_keys(settings)
    if not keys:
        parser.error("no HS256 key to sign with: set SUNDIAL_JWT_SECRET or SUNDIAL_JWT_KEYS (or pass --secret)")
    print(
        issue_token(
            keys[0].secret,
            args.tenant,
            subject=args.subject,
            admin=args.admin,
            ttl_sec=args.ttl,
            kid=keys[0].kid,
            audience=settings.jwt_audience,
        )
    )
    return 0
