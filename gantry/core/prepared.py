"""Prepared statements for the runner protocol's hot routes (docs/performance.md, "Runner routes").

A runner call is a handful of small statements, and building them through the
ORM cost more CPU than PostgreSQL spent running them: query compilation was
64% of the lifecycle's Python samples. The hot routes therefore run fixed SQL
here, through psycopg's own prepared statements (``prepare=True``): parsed and
planned once per database session, then one Bind/Execute round trip per call.

Rows come back as tuples; :func:`instance` turns one into a model instance
without a query, so services still hand ``Run``/``Runner`` objects to callers.

Inside a caller's transaction (a test, an ``atomic`` block) these run in it
like any other statement; in autocommit each statement is its own transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)


def _connection() -> tuple[Any, psycopg.Connection[Any]]:
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    return db, db.connection


def fetchone(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """Run ``sql`` (``%s`` placeholders) as a prepared statement; its first row, or None."""
    db, conn = _connection()
    # A server-side-binding cursor: Django's default ClientCursor inlines the
    # values into the text, which can never be prepared.
    with db.wrap_database_errors, psycopg.Cursor(conn) as cur:
        cur.execute(sql, params, prepare=True)  # type: ignore[arg-type]  # a module constant, not user text
        return cur.fetchone() if cur.description else None


def fetchall(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` as a prepared statement; all its rows."""
    db, conn = _connection()
    with db.wrap_database_errors, psycopg.Cursor(conn) as cur:
        cur.execute(sql, params, prepare=True)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def columns(model: type[Model], alias: str = "") -> str:
    """The model's concrete columns as a select list, in :func:`instance`'s order."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f'{prefix}"{f.column}"' for f in model._meta.concrete_fields)


def width(model: type[Model]) -> int:
    return len(model._meta.concrete_fields)


def instance(model: type[M], row: Sequence[Any], offset: int = 0) -> M:
    """A model instance from ``row[offset:]`` laid out as :func:`columns`, as the ORM would build it (no query).

    Field converters run as in a queryset (a JSON column arrives as text: Django
    tells psycopg not to parse it, and the field's ``from_db_value`` does).
    """
    db = connections[DEFAULT_DB_ALIAS]
    fields: list[Field[Any, Any]] = list(model._meta.concrete_fields)
    values = []
    for i, f in enumerate(fields):
        value = row[offset + i]
        convert = getattr(f, "from_db_value", None)
        if convert is not None and value is not None:
            value = convert(value, None, db)
        values.append(value)
    return model.from_db(DEFAULT_DB_ALIAS, [f.attname for f in fields], values)
