"""Launchers by kind: ``launchers.get("local")``, ``launchers.create("local", state_dir=...)``.

Each kind lives in a module of its own name (``launchers/local.py`` for
``local``) and registers its class with :func:`register`; :func:`get` imports
that module on first use, so a coordinator only loads the launcher it runs
(and a kind's client library, like the Docker SDK, is needed only there).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from launchers.base import Assignment, Launcher, LaunchError, UnseenExit, WorkerHandle

__all__ = ["Assignment", "LaunchError", "Launcher", "UnseenExit", "WorkerHandle", "create", "get", "kinds", "register"]

_REGISTRY: dict[str, type[Launcher]] = {}
# Kinds shipped here; importing their module registers them.
BUILTIN = ("local", "docker", "kubernetes", "fake")

L = TypeVar("L", bound=type[Launcher])


def register(kind: str) -> Callable[[L], L]:
    """Class decorator: make ``cls`` the launcher of ``kind``."""

    def decorate(cls: L) -> L:
        if kind in _REGISTRY and _REGISTRY[kind] is not cls:
            raise ValueError(f"launcher kind {kind!r} is registered twice")
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return decorate


def get(kind: str) -> type[Launcher]:
    if kind not in _REGISTRY:
        try:
            importlib.import_module(f"launchers.{kind}")
        except ModuleNotFoundError as exc:
            if exc.name != f"launchers.{kind}":
                raise  # the kind exists but a library it needs is missing: say so
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ValueError(f"unknown launcher kind {kind!r}; known: {', '.join(kinds())}") from None


def create(kind: str, *, state_dir: Path, options: Mapping[str, str] | None = None) -> Launcher:
    return get(kind).from_options(dict(options or {}), state_dir=state_dir)


def kinds() -> list[str]:
    return sorted(set(BUILTIN) | set(_REGISTRY))
