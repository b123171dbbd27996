"""The fast lane's own database connections, used on the event loop under gantry.asgi (docs/decisions.md, 17).

The lane's hot calls (status, ready, accept, done, deregister) are one round
trip each. Run on a request thread, each also paid the hand-off from the event
loop to that thread and back (an executor future, a thread wake-up, the loop's
self-pipe, the GIL passed twice) and Django's per-call connection
bookkeeping: more Python than the statement's own client side. Here the same
plans (gantry.sql.statement) run on psycopg's asyncio connections from a pool
of this loop's own, so the loop awaits PostgreSQL's answer as it awaits the
client's bytes.

The pool is psycopg's (psycopg_pool.AsyncConnectionPool), one per event loop
(a gunicorn worker has one), ``GANTRY_LANE_DB_POOL_MAX`` connections at most
(gantry.conf.server()), beside Django's pool. Its connections are Django's:
the same parameters (database, user, adapters, so rows load as the ORM's
would) and the session time zone Django sets, in autocommit. A connection is
checked as it leaves the pool the way gantry.core.pool_check checks Django's:
a round trip only when its socket has something to read (a dropped one has).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg_pool import AsyncConnectionPool

from gantry import conf
from gantry.core import pool_check
from gantry.sql.session import set_time_zone

# This loop's open pool (the fast path), and the task opening it (the first calls wait for it).
_ready: dict[asyncio.AbstractEventLoop, AsyncConnectionPool[Any]] = {}
_opening: dict[asyncio.AbstractEventLoop, asyncio.Task[AsyncConnectionPool[Any]]] = {}


def max_size() -> int:
    """Connections per event loop at most (``GANTRY_LANE_DB_POOL_MAX``)."""
    return conf.server().lane_db_pool_max


def _params() -> dict[str, Any]:
    """Django's connection parameters for the default database, for an asyncio connection in autocommit."""
    params = connections[DEFAULT_DB_ALIAS].get_connection_params()  # without Django's pool options
    params.pop("cursor_factory", None)  # Django's sync cursor class; psycopg's async one is the default
    params["autocommit"] = True
    return params


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # Django's loader for timestamptz attaches the connection's time zone to
    # the values as they come (it does not convert), so the session must be in
    # that zone, as Django's own init_connection_state makes it.
    zone = connections[DEFAULT_DB_ALIAS].timezone_name
    if conn.info.parameter_status("TimeZone") != zone:
        await conn.execute(set_time_zone(zone))


async def _check(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise when the connection is unusable; a round trip only when its socket is readable (pool_check's rule)."""
    if pool_check.needs_query(conn):
        await AsyncConnectionPool.check_connection(conn)


async def _pool() -> AsyncConnectionPool[Any]:
    loop = asyncio.get_running_loop()
    pool = _ready.get(loop)
    if pool is not None:
        return pool
    opening = _opening.get(loop)
    if opening is None:
        opening = _opening[loop] = loop.create_task(_open(loop))
    return await opening


async def _open(loop: asyncio.AbstractEventLoop) -> AsyncConnectionPool[Any]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        kwargs=_params(),
        min_size=1,
        max_size=max_size(),
        open=False,
        configure=_configure,
        check=_check,
        name="gantry-fast-lane",
        timeout=10.0,
    )
    try:
        await pool.open()
    except BaseException:
        _opening.pop(loop, None)  # the next call tries again
        raise
    _ready[loop] = pool
    return pool


@asynccontextmanager
async def connection() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of this loop's pool for one hot call; back to the pool after it (a broken one is replaced).

    Raises psycopg's errors (PoolTimeout, an OperationalError, when none is
    free within 10 s): the lane hands the call to Django then.
    """
    pool = await _pool()
    async with pool.connection() as conn:
        yield conn


async def close() -> None:
    """Close this loop's pool, if it has one (the server's shutdown; a test's end)."""
    loop = asyncio.get_running_loop()
    opening = _opening.pop(loop, None)
    pool = _ready.pop(loop, None)
    if pool is None and opening is not None:
        pool = await opening
        _ready.pop(loop, None)
    if pool is not None:
        await pool.close()
