"""Prepared statements for the runner protocol's hot routes (docs/performance.md, "Runner routes").

A runner call is a handful of small statements, and building them through the
ORM cost more CPU than PostgreSQL spent running them: query compilation was
64% of the lifecycle's Python samples. The hot routes therefore run fixed SQL
here, as the claim does (gantry/dispatch/claim.py): each statement is
``PREPARE``d by name once per database session, then ``EXECUTE``d, and a
transaction of several goes to the server as one simple-query message
(``BEGIN; EXECUTE ...; COMMIT``): one round trip, no parse or plan per call.
(psycopg's own ``prepare=True`` is off on Django's connections: Django sets
``prepare_threshold`` to None.)

Rows come back as tuples; :func:`instance` turns one into a model instance
without a query, so services still hand ``Run``/``Runner`` objects to callers.

Inside a caller's transaction (a test, an ``atomic`` block) the EXECUTEs run
in it and the caller commits; in autocommit the message is its own transaction.
"""

from __future__ import annotations

import hashlib
import uuid
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Model
from django.db.models.base import ModelState
from psycopg import sql

M = TypeVar("M", bound=Model)
T = TypeVar("T")
Rows = list[list[tuple[Any, ...]]]


def _connection() -> tuple[Any, psycopg.Connection[Any]]:
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    return db, db.connection


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
    values = {}
    for i, f in enumerate(model._meta.concrete_fields):
        value = row[offset + i]
        convert = getattr(f, "from_db_value", None)
        if convert is not None and value is not None:
            value = convert(value, None, db)
        values[f.attname] = value
    return loaded(model, **values)


def loaded(model: type[M], **values: Any) -> M:
    """A saved instance holding ``values`` (attnames); any other field loads on first access, as a deferred one.

    Built as Django unpickles a model (``Model.__reduce__``): without running
    ``__init__``, whose per-field defaults and signals cost more than the
    route's statement (the models here have no init-signal receivers).
    """
    obj = model.__new__(model)
    obj.__dict__.update(values)
    state = ModelState()
    state.adding = False
    state.db = DEFAULT_DB_ALIAS
    obj._state = state
    return obj


# ---------------------------------------------------------------- several statements in one message
#
# A transaction of several statements would cost a round trip each, plus BEGIN
# and COMMIT. As the claim does (gantry/dispatch/claim.py), statements are
# PREPAREd by name once per session, and BEGIN, their EXECUTEs and COMMIT go to
# the server as one simple-query message: one round trip. Each statement of
# that message still takes its own snapshot (READ COMMITTED), so a statement
# after a lock sees what the lock waited for.


class Statement:
    """One named statement; ``params`` are (name, SQL type) in ``$n`` order, used as ``%(name)s`` in ``sql``."""

    def __init__(self, label: str, sql: str, params: Sequence[tuple[str, str]]) -> None:
        numbered = sql
        for i, (name, _) in enumerate(params, 1):
            numbered = numbered.replace(f"%({name})s", f"${i}")
        # Named after the text, so a session never runs a stale version of it.
        self.name = f"gantry_{label}_" + hashlib.sha256(numbered.encode()).hexdigest()[:12]
        self.params = tuple(name for name, _ in params)
        self.types = tuple(t for _, t in params)
        self.prepare_sql = f"PREPARE {self.name} ({', '.join(t for _, t in params)}) AS {numbered}"
        self.execute_sql = f"EXECUTE {self.name} ({', '.join('%s' for _ in params)})"
        # The sessions (sync or asyncio connections) that have it prepared.
        self._prepared_on: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    def ensure_prepared(self, conn: psycopg.Connection[Any]) -> None:
        if conn not in self._prepared_on:
            conn.execute(self.prepare_sql)
            self._prepared_on[conn] = True

    async def aensure_prepared(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if conn not in self._prepared_on:
            await conn.execute(self.prepare_sql)
            self._prepared_on[conn] = True

    def forget(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        self._prepared_on.pop(conn, None)


def fetchone(statement: Statement, args: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """EXECUTE one statement (one round trip; in autocommit it is its own transaction); its first row, or None."""
    rows = run_script([(statement, dict(args))], transaction=False)[0]
    return rows[0] if rows else None


def run_script(
    steps: Sequence[tuple[Statement, dict[str, Any]]], *, synchronous_commit: bool = True, transaction: bool = True
) -> list[list[tuple[Any, ...]]]:
    """Run the statements as one transaction in one round trip; each one's rows, in order.

    In autocommit the message is ``BEGIN; EXECUTE ...; COMMIT``; inside a
    caller's transaction (an ``atomic`` block, a test) it is the EXECUTEs
    alone and the caller commits. Any error rolls back what the message did
    (in autocommit) and is raised as Django's database error.
    """
    db, conn = _connection()
    autocommit = db.get_autocommit() and not db.in_atomic_block
    # One statement in autocommit is a transaction by itself: no BEGIN/COMMIT.
    own = autocommit and transaction
    with db.wrap_database_errors:
        try:
            return _run(conn, steps, own=own, synchronous_commit=synchronous_commit)
        except psycopg.errors.InvalidSqlStatementName:
            # The session lost its prepared statements (DISCARD ALL or
            # DEALLOCATE by someone else): prepare again, run once more.
            if not autocommit:
                raise  # the caller's transaction is aborted: theirs to retry
            for statement, _ in steps:
                statement.forget(conn)
            return _run(conn, steps, own=own, synchronous_commit=synchronous_commit)


def _run(
    conn: psycopg.Connection[Any],
    steps: Sequence[tuple[Statement, dict[str, Any]]],
    *,
    own: bool,
    synchronous_commit: bool,
) -> list[list[tuple[Any, ...]]]:
    for statement, _ in steps:
        statement.ensure_prepared(conn)
    text, skip = _script_text(conn, steps, own=own, synchronous_commit=synchronous_commit)
    out: Rows = []
    with psycopg.ClientCursor(conn) as cur:
        try:
            cur.execute(text)  # no parameters: the literals are in the text
            for _ in range(skip):
                cur.nextset()  # past BEGIN's (and SET's) empty result
            for _ in steps:
                out.append(cur.fetchall() if _has_rows(cur) else [])
                cur.nextset()
        except BaseException:
            if own and not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            raise
    return out


def _script_text(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    steps: Sequence[tuple[Statement, dict[str, Any]]],
    *,
    own: bool,
    synchronous_commit: bool,
) -> tuple[str, int]:
    """The one message for ``steps`` and how many empty results (BEGIN's, SET's) come before the first step's."""
    parts = [execute_text(statement, args, conn) for statement, args in steps]
    begin = ["BEGIN"] if synchronous_commit else ["BEGIN", "SET LOCAL synchronous_commit = off"]
    if not own:
        return "; ".join(parts), 0
    return "; ".join([*begin, *parts, "COMMIT"]), len(begin)


def _has_rows(cur: psycopg.ClientCursor[Any] | psycopg.AsyncClientCursor[Any]) -> bool:
    # The result's status, not cur.description: that builds a Column for each
    # of the result's columns (4% of the lifecycle's Python samples, for
    # accept's and done's twenty-odd).
    result = cur.pgresult
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


# ---------------------------------------------------------------- plans: one hot path, two drivers
#
# A hot path (gantry.core.services.hotpath and its callers up to the fast
# lane's routes) is written once, as a generator: it yields the Script of each
# round trip it needs and receives that script's rows, and it yields an
# AfterCommit for work that must wait for its writes to commit (a metric).
# :func:`drive` runs it on Django's connection, in a caller's transaction or in
# autocommit, as every sync caller does; :func:`adrive` runs it on an
# asyncio connection in autocommit, as the fast lane does on the event loop
# under gantry.asgi (gantry.api.lanedb), with no thread hand-off. The SQL, the
# guards and the answers are the same object either way.


@dataclass(frozen=True, slots=True)
class Script:
    """The statements of one round trip; one transaction unless ``transaction`` is False (a single statement)."""

    steps: Sequence[tuple[Statement, dict[str, Any]]]
    synchronous_commit: bool = True
    transaction: bool = True


@dataclass(frozen=True, slots=True)
class AfterCommit:
    """Work for after the plan's writes have committed (Django's on_commit; at once in autocommit)."""

    func: Callable[[], object]


Plan = Generator[Script | AfterCommit, Any, T]


def drive(plan: Plan[T]) -> T:
    """Run ``plan`` on Django's connection: each Script through :func:`run_script`; its result."""
    try:
        step = next(plan)
        while True:
            if isinstance(step, AfterCommit):
                transaction.on_commit(step.func)
                step = plan.send(None)
            else:
                rows = run_script(step.steps, synchronous_commit=step.synchronous_commit, transaction=step.transaction)
                step = plan.send(rows)
    except StopIteration as stop:
        return stop.value


async def adrive(plan: Plan[T], conn: psycopg.AsyncConnection[Any]) -> T:
    """Run ``plan`` on ``conn`` (autocommit, the caller's alone): each Script in one round trip; its result."""
    try:
        step = next(plan)
        while True:
            if isinstance(step, AfterCommit):
                step.func()  # autocommit: each script has committed by the time it answered
                step = plan.send(None)
            else:
                step = plan.send(await arun_script(conn, step))
    except StopIteration as stop:
        return stop.value


async def arun_script(conn: psycopg.AsyncConnection[Any], script: Script) -> Rows:
    """:func:`run_script` on an asyncio connection in autocommit; psycopg's errors are raised as they are."""
    try:
        return await _arun(conn, script)
    except psycopg.errors.InvalidSqlStatementName:
        for statement, _ in script.steps:
            statement.forget(conn)
        return await _arun(conn, script)


async def _arun(conn: psycopg.AsyncConnection[Any], script: Script) -> Rows:
    for statement, _ in script.steps:
        await statement.aensure_prepared(conn)
    own = script.transaction
    text, skip = _script_text(conn, script.steps, own=own, synchronous_commit=script.synchronous_commit)
    out: Rows = []
    async with psycopg.AsyncClientCursor(conn) as cur:
        try:
            await cur.execute(text)
            for _ in range(skip):
                cur.nextset()
            for _ in script.steps:
                out.append(await cur.fetchall() if _has_rows(cur) else [])
                cur.nextset()
        except BaseException:
            if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                await conn.rollback()
            raise
    return out


# ---------------------------------------------------------------- the EXECUTE's literals
#
# EXECUTE takes its arguments as literals in the statement's text. psycopg's
# client-side binding (ClientCursor with parameters) finds the placeholders,
# picks a dumper and quotes through libpq for every value of every call: 6% of
# the lifecycle's Python samples, for a few uuids, timestamps and integers.
# The statement knows each parameter's SQL type, so the common values are
# written here directly; anything else (a type or value not handled below) is
# quoted by psycopg, as before. Strings are E'' literals with backslashes and
# quotes doubled, read the same whatever standard_conforming_strings says.


def execute_text(
    statement: Statement, args: Mapping[str, Any], conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
) -> str:
    """``EXECUTE name (literal, ...)`` for ``args``, each written as a literal of its parameter's type."""
    values = ", ".join(
        literal(args[name], kind, conn) for name, kind in zip(statement.params, statement.types, strict=True)
    )
    return f"EXECUTE {statement.name} ({values})"


def literal(value: Any, kind: str, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str:
    """``value`` as an SQL literal for a parameter of type ``kind`` (the EXECUTE casts it to that type)."""
    if value is None:
        return "NULL"
    cls = type(value)
    if cls is uuid.UUID:
        return f"'{value}'"
    if cls is bool:
        return "TRUE" if value else "FALSE"
    if cls is int and kind in ("bigint", "integer"):
        return str(value) if value >= 0 else f"({value})"  # so no operator can bind to the bare number
    if cls is str and "\x00" not in value:
        return _text(value)
    if cls is datetime and value.tzinfo is not None:
        return f"'{value.isoformat()}'"
    if cls is list and kind == "text[]" and all(type(v) is str and "\x00" not in v for v in value):
        return f"ARRAY[{', '.join(_text(v) for v in value)}]::text[]"
    # Anything else (a NUL in a string, a naive datetime, another type):
    # psycopg's own quoting, and its error for what PostgreSQL cannot hold.
    return sql.Literal(value).as_string(conn)


def _text(value: str) -> str:
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
