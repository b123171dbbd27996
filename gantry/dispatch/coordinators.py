"""Which coordinators poll a runner group: the identity they send on the poll (docs/protocol.md).

A coordinator sends its instance id, host name and version in three optional
headers (gantry_wire.protocol ``COORDINATOR_*_HEADER``). The poll is the hot
path, so what it costs is bounded:

- no database write at all: one Redis hash per group,
  ``gantry:coordinators:group:<id>``, field = the coordinator's id, value =
  ``{"host", "version", "seen"}`` (JSON, ``seen`` in Unix seconds), expiring
  :data:`RETENTION_SECONDS` after its last write;
- at most one write per coordinator every :data:`WRITE_EVERY_SECONDS` per
  server process (a process-local note of the last write), so a coordinator
  polling every second costs one Redis call every few seconds, and "last
  poll" on the page is that many seconds coarse (far below
  GANTRY_POLL_STALE_AFTER, which decides "silent");
- a hash holds at most :data:`MAX_PER_GROUP` coordinators (the oldest go),
  whatever ids a token holder invents;
- best effort: a Redis error never fails the poll (logged, once per
  :data:`WARN_EVERY_SECONDS`).

An older coordinator, which sends none of the headers, is recorded nowhere:
the group's ``last_polled_at`` still says it polls, and the group page says
that an unidentified coordinator does.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from gantry import redis as gantry_redis
from gantry.core.errors import InvalidRequest
from gantry_wire.protocol import (
    COORDINATOR_HEADER_MAX,
    COORDINATOR_HOST_HEADER,
    COORDINATOR_ID_HEADER,
    COORDINATOR_VERSION_HEADER,
)

log = logging.getLogger("gantry.dispatch")

KEY_PREFIX = "gantry:coordinators:group:"
WRITE_EVERY_SECONDS = 5.0
RETENTION_SECONDS = 24 * 3600
MAX_PER_GROUP = 100
WARN_EVERY_SECONDS = 60.0

# Visible ASCII, no spaces: host names, versions and ids all fit; nothing a page or a log could be confused by.
_VALUE = re.compile(r"[\x21-\x7e]+")


@dataclass(frozen=True)
class Identity:
    """What one poll said about its coordinator."""

    id: str
    host: str
    version: str


@dataclass(frozen=True)
class Coordinator:
    """A coordinator as recorded: its identity and its last recorded poll."""

    id: str
    host: str
    version: str
    last_poll: datetime


def _meta_name(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


# (header name, WSGI META key, lowercase bytes as an ASGI scope carries it)
HEADERS = tuple((h, _meta_name(h), h.lower().encode()) for h in COORDINATOR_HEADER_MAX)


def identity(get: Callable[[str], str | None]) -> Identity | None:
    """The poll's identity from its headers (``get(header name)``); None when it sent none.

    Raises InvalidRequest (400) for a value that is too long or not visible
    ASCII. An id alone, or a host alone, is enough (the host then stands for
    the id); a version alone names no one and is dropped.
    """
    values: dict[str, str] = {}
    for header in COORDINATOR_HEADER_MAX:
        raw = get(header)
        if raw is None or raw == "":
            continue
        limit = COORDINATOR_HEADER_MAX[header]
        if len(raw) > limit or not _VALUE.fullmatch(raw):
            raise InvalidRequest(f"{header} must be 1 to {limit} visible ASCII characters without spaces")
        values[header] = raw
    ident = values.get(COORDINATOR_ID_HEADER) or values.get(COORDINATOR_HOST_HEADER)
    if ident is None:
        return None
    return Identity(
        id=ident, host=values.get(COORDINATOR_HOST_HEADER, ""), version=values.get(COORDINATOR_VERSION_HEADER, "")
    )


def identity_of_meta(meta: dict[str, object]) -> Identity | None:
    """:func:`identity` from a Django request's META."""
    by_header = {h: m for h, m, _ in HEADERS}

    def get(header: str) -> str | None:
        value = meta.get(by_header[header])
        return value if isinstance(value, str) else None

    return identity(get)


def key_for(group_id: int) -> str:
    return f"{KEY_PREFIX}{group_id}"


# (group id, coordinator id) -> (monotonic time of this process's last write, what it wrote)
_written: dict[tuple[int, str], tuple[float, Identity]] = {}
_written_lock = threading.Lock()
_last_warning = 0.0


def forget_writes() -> None:
    """Forget this process's recent writes (tests that read what the next poll records)."""
    with _written_lock:
        _written.clear()


def record(*, group_id: int, who: Identity | None, now: float | None = None) -> bool:
    """Note that ``who`` polled ``group_id`` now; answers whether Redis was written. Never raises."""
    if who is None:
        return False
    mono = time.monotonic()
    key = (group_id, who.id)
    with _written_lock:
        last = _written.get(key)
        if last is not None and mono - last[0] < WRITE_EVERY_SECONDS and last[1] == who:
            return False
        if len(_written) > 10 * MAX_PER_GROUP * 100:  # a bound on this process's notes, not a policy
            _written.clear()
        _written[key] = (mono, who)
    seen = time.time() if now is None else now
    value = json.dumps({"host": who.host, "version": who.version, "seen": seen})
    try:
        pipe = gantry_redis.client().pipeline(transaction=False)
        pipe.hset(key_for(group_id), who.id, value)
        pipe.hlen(key_for(group_id))
        pipe.expire(key_for(group_id), RETENTION_SECONDS)
        _, size, _ = pipe.execute()
        if int(size) > MAX_PER_GROUP:
            _trim(group_id)
    except (redis.RedisError, OSError, ValueError) as exc:
        with _written_lock:
            _written.pop(key, None)  # the next poll tries again
        _warn(group_id, exc)
        return False
    return True


def _trim(group_id: int) -> None:
    """Keep the MAX_PER_GROUP most recent coordinators of the group (rare: only past the bound)."""
    client = gantry_redis.client()
    found = _parse(client.hgetall(key_for(group_id)))
    stale = [c.id for c in found[MAX_PER_GROUP:]]
    if stale:
        client.hdel(key_for(group_id), *stale)


def _warn(group_id: int, exc: BaseException) -> None:
    global _last_warning
    now = time.monotonic()
    if now - _last_warning >= WARN_EVERY_SECONDS:
        _last_warning = now
        log.warning(
            "could not record a coordinator's poll",
            extra={"event": "coordinators.record_failed", "group_id": group_id, "error": repr(exc)},
        )


def _parse(raw: Any) -> list[Coordinator]:
    """The hash's coordinators (HGETALL's answer), most recent poll first; unreadable entries are skipped."""
    out = []
    for field, value in dict(raw).items():
        try:
            data = json.loads(value)
            seen = datetime.fromtimestamp(float(data["seen"]), tz=UTC)
            name = field.decode() if isinstance(field, bytes) else str(field)
            out.append(Coordinator(id=name, host=str(data.get("host", "")),
                                   version=str(data.get("version", "")), last_poll=seen))  # fmt: skip
        except (ValueError, TypeError, KeyError, OverflowError, UnicodeDecodeError):
            continue
    out.sort(key=lambda c: (c.last_poll, c.id), reverse=True)
    return out


def of_groups(group_ids: Iterable[int]) -> dict[int, list[Coordinator]] | None:
    """Each group's recorded coordinators, most recent first (one Redis round trip); None when Redis failed."""
    ids = list(group_ids)
    if not ids:
        return {}
    try:
        pipe = gantry_redis.client().pipeline(transaction=False)
        for group_id in ids:
            pipe.hgetall(key_for(group_id))
        answers = pipe.execute()
    except (redis.RedisError, OSError, ValueError) as exc:
        _warn(ids[0], exc)
        return None
    return {group_id: _parse(raw) for group_id, raw in zip(ids, answers, strict=True)}
