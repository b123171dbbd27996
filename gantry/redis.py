"""One Redis client (and connection pool) per process, from ``settings.REDIS_URL``.

Everything Gantry keeps in Redis (the dispatch throttle's token buckets, live
log records) goes through :func:`client`, so a process holds one pool however
many threads use it. redis-py pools are thread-safe and reset themselves in a
child after ``fork`` (gunicorn, Celery prefork).

Timeouts are short on purpose: Redis is consulted on the poll path, inside the
claim's transaction, and every caller has a fallback (the throttle fails open,
a live-log push is best-effort). A Redis that has gone away must cost a poll
half a second at most, never the library's default of seconds per attempt
times its default retries.
"""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

# Seconds to open a connection / to wait for an answer.
CONNECT_TIMEOUT = 0.5
SOCKET_TIMEOUT = 0.5
# One immediate retry on a connection error: a pooled socket that a Redis
# restart has closed fails its first command, and reconnecting at once is
# the cure. More would only multiply the stall when Redis is really down.
RETRIES = 1

_lock = threading.Lock()
# Keyed by URL, so a changed ``settings.REDIS_URL`` (tests' override_settings)
# gets its own client without anyone having to remember to reset.
_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    """The process's client for ``settings.REDIS_URL`` (created on first use)."""
    url: str = settings.REDIS_URL
    found = _clients.get(url)
    if found is not None:
        return found
    with _lock:
        found = _clients.get(url)
        if found is None:
            found = redis.Redis.from_url(
                url,
                socket_connect_timeout=CONNECT_TIMEOUT,
                socket_timeout=SOCKET_TIMEOUT,
                retry=Retry(NoBackoff(), RETRIES),
            )
            _clients[url] = found
        return found


def reset() -> None:
    """Drop every client and close its connections (tests; a process that changes its settings)."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for c in clients:
        c.connection_pool.disconnect()
