"""Strict readers for settings taken from the environment: ``gantry.conf``'s.

Every reader fails loudly with the variable's name when a value is malformed:
a typo in a deployment's environment must stop the process at start, not show
up hours later as a surprising default. ``gantry/conf.py`` is where they are
called for a ``GANTRY_*`` name (tests/test_layers.py holds that); everything
else asks conf for the value.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envstr(name: str, default: str = "") -> str:
    """A string; ``NAME_FILE`` (a path) wins over ``NAME`` so secrets can come from files."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def envint(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above its maximum {maximum}")
    return value


def envseconds(name: str, default: float, *, minimum: float, maximum: float) -> float:
    """Seconds, a fraction allowed (unlike the whole seconds of :func:`envint`)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number of seconds") from None
    if not minimum <= value <= maximum:  # also refuses nan
        raise ImproperlyConfigured(f"{name}={raw} is outside {minimum:g}-{maximum:g} seconds")
    return value


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]
