"""The pool's checkout check (gantry/core/pool_check.py): quiet for a healthy connection, failing for a dropped one."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from gantry.core import pool_check


def _connect() -> psycopg.Connection:
    params = {k: v for k, v in connection.get_connection_params().items() if k not in ("cursor_factory", "context")}
    return psycopg.connect(**params, autocommit=True)


@pytest.mark.django_db
def test_it_is_the_pools_check_once_a_connection_is_made() -> None:
    connection.ensure_connection()
    if connection.pool is None:
        pytest.skip("GANTRY_DB_POOL is off")
    # psycopg_pool keeps its check in _check (3.3); this fails if that changes.
    assert connection.pool._check is pool_check.check_connection


@pytest.mark.django_db
def test_it_passes_a_healthy_connection_and_fails_a_dropped_one() -> None:
    conn, other = _connect(), _connect()
    try:
        pool_check.check_connection(conn)  # healthy: returns quietly
        other.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pool_check.check_connection(conn)
            except psycopg.OperationalError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("a connection whose backend was terminated passed the check")
    finally:
        conn.close()
        other.close()
