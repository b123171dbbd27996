"""Credentials: group and runner JWTs, and run API tokens.

Group token: audience ``runner-group``, the group id (``sub``), the group's
``token_version`` (``ver``) and, since issue 12, its organization (``org``,
signed with the rest and checked against the group's row); no expiry; bumping
the version revokes it.
Runner token: audience ``runner``, the runner id (``sub``), its run (``run``)
and group (``grp``); minted by the poll, useless once the runner row is gone.
Both are HS256, signed with the first of ``GANTRY_JWT_KEYS`` and verified with
whichever key their ``kid`` header names, so keys rotate without a cut-off.
Run API token: random, handed out once in RunContext, stored only as sha256.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import jwt
from django.conf import settings

ISSUER = "gantry"
AUD_GROUP = "runner-group"
AUD_RUNNER = "runner"
ALGORITHM = "HS256"


class TokenInvalid(Exception):
    """A JWT that is forged, malformed, expired or signed with an unknown key."""


def _encode(claims: dict[str, Any]) -> str:
    kid = settings.GANTRY_JWT_SIGNING_KID
    return jwt.encode(
        {"iss": ISSUER, **claims}, settings.GANTRY_JWT_KEYS[kid], algorithm=ALGORITHM, headers={"kid": kid}
    )


def mint_group_token(*, group_id: int, token_version: int, organization_id: int | None = None) -> str:
    """A group token; with ``organization_id`` it names the group's org too (``org``), so the fast lane's poll
    can send its check and its claim in one message (gantry/server/lane.py). Tokens without it still work."""
    claims: dict[str, Any] = {"aud": AUD_GROUP, "sub": str(group_id), "ver": token_version}
    if organization_id is not None:
        claims["org"] = organization_id
    return _encode(claims)


def mint_runner_token(*, runner_id: uuid.UUID, run_id: uuid.UUID, group_id: int) -> str:
    subject = str(runner_id)
    claims: dict[str, Any] = {"aud": AUD_RUNNER, "sub": subject, "run": str(run_id), "grp": group_id}
    token = _encode(claims)
    # Its first use (ready) would verify it again; when that call reaches this
    # process the answer is already known: the claims it was signed with.
    _remember(token, Claims(audience=AUD_RUNNER, subject=subject, raw={"iss": ISSUER, **claims}))
    return token


@dataclass(frozen=True)
class Claims:
    audience: str
    subject: str
    raw: dict[str, Any]


# Verified tokens without a time claim, per process: a runner sends the same
# token on every call (/status every few seconds), and verifying it again cost
# more than the route's database work. Keyed by the verification keys too, so
# a key set that changes (rotation, a test's override) verifies afresh.
# Revocation never depended on this: it is the row checks (token_version,
# the runner row), made on every call. Bounded: an old entry is dropped.
_VERIFIED: dict[tuple[str, tuple[tuple[str, str], ...]], Claims] = {}
_VERIFIED_MAX = 8192
_VERIFIED_LOCK = threading.Lock()
_TIME_CLAIMS = ("exp", "nbf", "iat")


def decode(token: str) -> Claims:
    """Verify signature, issuer and expiry (if any); the caller checks the audience."""
    keys = tuple(sorted(settings.GANTRY_JWT_KEYS.items()))
    cached = _VERIFIED.get((token, keys))
    if cached is not None:
        return cached
    claims = _verify(token)
    if not any(name in claims.raw for name in _TIME_CLAIMS):
        _remember(token, claims, keys)
    return claims


def _remember(token: str, claims: Claims, keys: tuple[tuple[str, str], ...] | None = None) -> None:
    if keys is None:
        keys = tuple(sorted(settings.GANTRY_JWT_KEYS.items()))
    with _VERIFIED_LOCK:  # request threads share the cache; eviction iterates it
        while len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.pop(next(iter(_VERIFIED)))  # the oldest entry (dicts keep insertion order)
        _VERIFIED[(token, keys)] = claims


def _verify(token: str) -> Claims:
    try:
        header = jwt.get_unverified_header(token)
        key = settings.GANTRY_JWT_KEYS.get(str(header.get("kid", "")))
        if key is None:
            raise TokenInvalid("token signed with an unknown key")
        raw = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            issuer=ISSUER,
            options={"verify_aud": False, "require": ["iss", "aud", "sub"]},
        )
    except jwt.PyJWTError as exc:
        raise TokenInvalid(str(exc)) from exc
    aud = raw.get("aud")
    if not isinstance(aud, str):
        raise TokenInvalid("token has no single audience")
    return Claims(audience=aud, subject=str(raw["sub"]), raw=raw)


def new_run_api_token() -> tuple[str, str]:
    """A fresh run API token and the sha256 hex digest that is all the database keeps."""
    token = "gr_" + secrets.token_urlsafe(32)
    return token, sha256_hex(token)


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()
