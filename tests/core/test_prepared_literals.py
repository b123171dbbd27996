"""The EXECUTE literals of gantry.sql.statement: each value reads back as psycopg's own binding would send it.

Against the test PostgreSQL: every case is selected twice, once written by
``statement.literal`` and once bound by psycopg, and the two answers must be
equal (and equal to the value).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from django.db import connection

from gantry.sql import statement as prepared

pytestmark = pytest.mark.django_db

NASTY = [
    "",
    "plain",
    "it's",
    "''",
    "\\",
    "\\'",
    "'\\",
    "\\\\'; DROP TABLE run; --",
    "E'x'",
    "$$ dollar $$",
    "%s %(name)s %%",
    "line\nbreak\ttab\r",
    "\\x41\\n\\u0041",
    "ünïcødé \u2013 🚀",
    "\u2028\u2029",
]

CASES: list[tuple[Any, str]] = [
    *[(s, "text") for s in NASTY],
    (uuid.UUID("6f1c2c1e-8f5a-4d2b-9a7e-3c2d1b0a9f8e"), "uuid"),
    (0, "bigint"),
    (-(2**63), "bigint"),
    (2**63 - 1, "bigint"),
    (2**31 - 1, "integer"),
    (True, "boolean"),
    (False, "boolean"),
    (None, "text"),
    (None, "uuid"),
    (datetime(2026, 12, 1, 23, 59, 59, 123456, tzinfo=UTC), "timestamptz"),
    (datetime(2026, 6, 1, 5, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))), "timestamptz"),
    (["running", "it's", "\\"], "text[]"),
    ([], "text[]"),
    ('{"count": 3, "sha256": "ab\'\\\\"}', "jsonb"),
    # Not written here: psycopg quotes them (a naive datetime, a float).
    (datetime(2026, 12, 1, 12, 0), "timestamp"),
    (1.5, "double precision"),
]


@pytest.mark.parametrize(("value", "kind"), CASES, ids=[f"{k}-{i}" for i, (_, k) in enumerate(CASES)])
def test_a_literal_reads_back_as_psycopgs_binding(value: Any, kind: str) -> None:
    connection.ensure_connection()
    conn = connection.connection
    text = prepared.literal(value, kind, conn)
    if type(value) is str:
        assert text.startswith("E'"), text  # written here, not handed to psycopg
    with psycopg.ClientCursor(conn) as cur:
        ours = cur.execute(f"SELECT ({text})::{kind}").fetchone()
        theirs = cur.execute(f"SELECT (%s)::{kind}", [value]).fetchone()
    assert ours == theirs
    if kind == "jsonb":
        return  # psycopg hands jsonb back as text on Django's connections
    assert ours is not None
    assert ours[0] == value


def test_a_nul_in_a_string_is_refused_as_psycopg_refuses_it() -> None:
    connection.ensure_connection()
    conn = connection.connection
    with pytest.raises(psycopg.DataError) as ours:
        prepared.literal("a\x00b", "text", conn)
    with pytest.raises(psycopg.DataError) as theirs, psycopg.ClientCursor(conn) as cur:
        cur.execute("SELECT %s::text", ["a\x00b"])
    assert type(ours.value) is type(theirs.value)


def test_an_execute_carries_its_literals_to_the_prepared_statement() -> None:
    statement = prepared.Statement(
        "echo_literals",
        "SELECT %(t)s, %(u)s, %(n)s, %(b)s, %(at)s, %(a)s",
        [("t", "text"), ("u", "uuid"), ("n", "bigint"), ("b", "boolean"), ("at", "timestamptz"), ("a", "text[]")],
    )
    args = {
        "t": "it's \\ 'quoted'",
        "u": uuid.uuid4(),
        "n": 42,
        "b": True,
        "at": datetime(2026, 12, 1, tzinfo=UTC),
        "a": ["x", "y'z"],
    }
    row = prepared.fetchone(statement, args)
    assert row == (args["t"], args["u"], 42, True, args["at"], ["x", "y'z"])
