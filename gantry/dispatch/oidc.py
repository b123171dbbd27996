"""Verifying a GitHub Actions OIDC token (docs/github-actions.md, "The exchange").

A workflow run asks GitHub for an OIDC token with Gantry's audience and
presents it at ``POST /api/v1/runners/{id}/oidc-exchange``. This module
answers whether the token is genuine: signed (RS256) by a key of the
issuer's JWKS, issued by ``GANTRY_GITHUB_OIDC_ISSUER``, for
``GANTRY_GITHUB_OIDC_AUDIENCE``, not expired, and carrying the claims the
exchange compares (``repository``, ``workflow_ref``, ``run_id``). Whether
it is *this runner's* workflow run is the exchange service's question
(``gantry.core.services.github``).

The JWKS is found through the issuer's discovery document and kept per
process. A token signed with a key id the cached set does not hold makes it
fetch the set again (GitHub rotates keys); such forced fetches happen at most
once per :data:`REFRESH_FLOOR` seconds, so a stream of tokens with made-up key
ids does not turn into a stream of fetches. Fetches use the standard library with a
short timeout, outside any database transaction.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import jwt

from gantry import conf
from gantry.core.errors import OidcTokenInvalid

log = logging.getLogger("gantry.oidc")

ALGORITHMS = ["RS256"]
# The claims the exchange needs; a token without them is refused here.
REQUIRED_CLAIMS = ["iss", "aud", "exp", "iat", "repository", "workflow_ref", "run_id"]
# Clock skew tolerated on exp/iat/nbf.
LEEWAY_SECONDS = 30
# Least time between two JWKS fetches forced by an unknown key id.
REFRESH_FLOOR = 30.0
# A JWKS held longer than this is fetched again on the next verification.
MAX_AGE = 3600.0
FETCH_TIMEOUT = 5.0


def _fetch_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "gantry-oidc"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT) as resp:
        return json.loads(resp.read())


@dataclass
class _KeySet:
    keys: dict[str, jwt.PyJWK]
    fetched_at: float


class JwksCache:
    """The issuer's signing keys, by key id, fetched through its discovery document."""

    def __init__(self, issuer: str, *, clock: Any = time.monotonic) -> None:
        self.issuer = issuer
        self._clock = clock
        self._lock = threading.Lock()
        self._set: _KeySet | None = None
        self._last_fetch = -REFRESH_FLOOR
        self.fetches = 0  # how many times the set was fetched (operators' logs, tests)

    def _fetch(self) -> _KeySet:
        discovery = _fetch_json(f"{self.issuer}/.well-known/openid-configuration")
        jwks = _fetch_json(str(discovery["jwks_uri"]))
        keys: dict[str, jwt.PyJWK] = {}
        for entry in jwks.get("keys", []):
            try:
                key = jwt.PyJWK.from_dict(entry)
            except jwt.PyJWTError:
                continue  # a key type we cannot use; the others still count
            if key.key_id:
                keys[key.key_id] = key
        self.fetches += 1
        log.info(
            "fetched the OIDC issuer's keys", extra={"event": "oidc.jwks_fetched", "issuer": self.issuer,
                                                     "keys": sorted(keys)},
        )  # fmt: skip
        return _KeySet(keys=keys, fetched_at=self._clock())

    def key(self, kid: str) -> jwt.PyJWK:
        """The key ``kid``; fetches the set when it is stale or lacks ``kid`` (rate-limited). Raises KeyError."""
        with self._lock:
            now = self._clock()
            stale = self._set is None or now - self._set.fetched_at > MAX_AGE
            missing = self._set is not None and kid not in self._set.keys
            forced = missing and now - self._last_fetch >= REFRESH_FLOOR
            if stale or forced:
                if forced:
                    # Only refreshes an unknown kid forced count against the floor: the
                    # first token signed with a freshly rotated key is never refused.
                    self._last_fetch = now
                try:
                    self._set = self._fetch()
                except (OSError, ValueError, KeyError) as exc:
                    log.warning(
                        "could not fetch the OIDC issuer's keys: %s", exc,
                        extra={"event": "oidc.jwks_fetch_failed", "issuer": self.issuer},
                    )  # fmt: skip
                    if self._set is None:
                        raise KeyError(kid) from exc
            assert self._set is not None
            return self._set.keys[kid]


_caches: dict[str, JwksCache] = {}
_caches_lock = threading.Lock()


def jwks_for(issuer: str) -> JwksCache:
    with _caches_lock:
        if issuer not in _caches:
            _caches[issuer] = JwksCache(issuer)
        return _caches[issuer]


def reset() -> None:
    """Forget every cached key set (tests; a new issuer in settings)."""
    with _caches_lock:
        _caches.clear()


def verify(token: str) -> dict[str, Any]:
    """The token's claims, once it is proven genuine and meant for Gantry; OidcTokenInvalid (401) otherwise."""
    cfg = conf.github()
    if not isinstance(token, str) or not token:
        raise OidcTokenInvalid("token must be a GitHub OIDC JWT")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise OidcTokenInvalid(f"malformed OIDC token: {exc}") from None
    if header.get("alg") not in ALGORITHMS:
        raise OidcTokenInvalid(f"OIDC token algorithm {header.get('alg')!r} is not accepted (RS256 only)")
    kid = str(header.get("kid") or "")
    try:
        key = jwks_for(cfg.oidc_issuer).key(kid)
    except KeyError:
        raise OidcTokenInvalid(f"OIDC token signed with a key the issuer does not publish (kid {kid!r})") from None
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=ALGORITHMS,
            audience=cfg.oidc_audience,
            issuer=cfg.oidc_issuer,
            leeway=LEEWAY_SECONDS,
            options={"require": REQUIRED_CLAIMS},
        )
    except jwt.ExpiredSignatureError:
        raise OidcTokenInvalid("OIDC token has expired") from None
    except jwt.InvalidAudienceError:
        raise OidcTokenInvalid(f"OIDC token is not for audience {cfg.oidc_audience!r}") from None
    except jwt.InvalidIssuerError:
        raise OidcTokenInvalid(f"OIDC token is not from issuer {cfg.oidc_issuer!r}") from None
    except jwt.PyJWTError as exc:
        raise OidcTokenInvalid(f"OIDC token refused: {exc}") from None
    return claims
