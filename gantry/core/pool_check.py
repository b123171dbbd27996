"""The database pool's check of a connection as it leaves the pool: a round trip only when the socket says so.

``CONN_HEALTH_CHECKS`` makes psycopg's pool run an empty query on every
checkout, so that a connection the database dropped (a restart, a failover)
is replaced instead of failing a request. A request-per-checkout server paid
that round trip on every request, as much as a one-statement hot call's own
(docs/performance.md, "Runner routes: statements and round trips").

A connection the server has closed, or is closing, has something to read on
its socket (the server's termination message, or end-of-file), while a
healthy idle connection in autocommit has nothing. So the check first polls
the socket without waiting, and runs the empty query only when there is
something to read: a dropped connection still fails the check and is
replaced, a healthy one costs one system call.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.signals import connection_created
from psycopg_pool import ConnectionPool


def needs_query(conn: Any) -> bool:
    """Whether the check must ask the server: the connection is closed or broken, or its socket is readable.

    For a sync or an asyncio psycopg connection alike (gantry.server.lanedb's
    pool checks its connections by the same rule).
    """
    if conn.closed or conn.broken:
        return True  # the pool's own check raises its own error for it
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def check_connection(conn: Any) -> None:
    """Raise, as psycopg's own check does, when the connection is unusable; the query only on a readable socket."""
    if needs_query(conn):
        ConnectionPool.check_connection(conn)


def install(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Give a pool Django built with the default check this one (``connection_created``: the pool exists by then).

    Django passes ``check=ConnectionPool.check_connection`` itself and offers no
    setting for another; the pool keeps its check in ``_check`` (psycopg_pool
    3.3, pinned; tests/api/test_pool_check.py fails if that changes).
    """
    pool = getattr(connection, "pool", None)
    if pool is not None and getattr(pool, "_check", None) is ConnectionPool.check_connection:
        pool._check = check_connection


def connect_signal() -> None:
    connection_created.connect(install, dispatch_uid="gantry.core.pool_check")
