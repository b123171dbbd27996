"""Stack secrets at rest: each value encrypted with Fernet, under keys from settings that can rotate.

``GANTRY_SECRETS_KEYS`` lists Fernet keys (``Fernet.generate_key()``, comma
separated): the first encrypts, all decrypt (``MultiFernet``), so a new key
goes in front and ``manage.py rotate_secrets`` re-encrypts every value under
it before the old key is dropped. Unset, one key is derived from the secret
key (fine for a laptop; in production set the list, so that rotating the
secret key does not make the secrets unreadable).

The ``stack.secrets`` column holds ``{name: token}``: names in the clear (they
are shown, and they are variable names), values only as Fernet tokens. Values
are decrypted in one place, for the RunContext that accept hands the runner.
"""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class SecretUnreadable(Exception):
    """A stored value no configured key decrypts (a key was dropped before rotating)."""


@functools.cache
def _keys() -> MultiFernet:
    raw = [k.strip() for k in (settings.GANTRY_SECRETS_KEYS or "").split(",") if k.strip()]
    if not raw:
        derived = hashlib.sha256(b"gantry stack secrets\0" + settings.SECRET_KEY.encode()).digest()
        raw = [base64.urlsafe_b64encode(derived).decode()]
    try:
        return MultiFernet([Fernet(key) for key in raw])
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"GANTRY_SECRETS_KEYS must be comma-separated Fernet keys: {exc}") from None


def reset_keys() -> None:
    """Forget the cached keys (tests that change GANTRY_SECRETS_KEYS)."""
    _keys.cache_clear()


def seal(values: dict[str, str]) -> dict[str, str]:
    """``{name: value}`` → ``{name: token}`` under the first key."""
    keys = _keys()
    return {name: keys.encrypt(value.encode("utf-8")).decode("ascii") for name, value in values.items()}


def unseal(stored: dict[str, str]) -> dict[str, str]:
    """``{name: token}`` → ``{name: value}``; SecretUnreadable names the value no key opens."""
    keys = _keys()
    out = {}
    for name, token in stored.items():
        try:
            out[name] = keys.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as exc:
            raise SecretUnreadable(f"secret {name!r} cannot be decrypted with GANTRY_SECRETS_KEYS") from exc
    return out


def rotate(stored: dict[str, str]) -> dict[str, str]:
    """Re-encrypt every token under the first key (MultiFernet.rotate)."""
    return {name: rotate_token(token) for name, token in stored.items()}


def rotate_token(token: str) -> str:
    """One sealed value re-encrypted under the first key (a webhook endpoint's secret is one such token)."""
    return _keys().rotate(token.encode("ascii")).decode("ascii")
