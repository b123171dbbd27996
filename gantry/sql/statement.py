"""Named, server-side prepared statements and the one way Gantry sends them (docs/decisions.md, 10).

Every statement of a hot path (the claim, the runner's calls, authentication)
is a :class:`Statement`: ``PREPARE``d by name once per database session, then
``EXECUTE``d with its arguments written as literals. A round trip goes to the
server as one simple-query message (a :class:`Script`): ``BEGIN``, the
EXECUTEs and ``COMMIT`` together, so a transaction of several statements costs
one wait for the server, and no statement is parsed or planned per call.
(psycopg's own ``prepare=True`` cannot share a message with BEGIN outside
pipeline mode, and Django turns it off on its connections.)

Each statement of a message still takes its own snapshot (READ COMMITTED), so
a statement after a lock sees what the lock waited for.

A session that lost its prepared statements (``DISCARD ALL``, ``DEALLOCATE``)
has them prepared again and the message sent once more: the rule is
:func:`_lost`, used by both drivers (inside a caller's transaction the script
runs in a savepoint of its own, which is rolled back first).

A hot path is written once, as a *plan* (:data:`Plan`): a generator that
yields each round trip's Script and receives its rows, and yields an
:class:`AfterCommit` for work that must wait for its writes (a metric).
:func:`drive` runs a plan on Django's connection, in a caller's transaction or
in autocommit, as every sync caller does; :func:`adrive` runs it on an asyncio
connection in autocommit, as the fast lane does on the event loop under
``gantry.asgi``. The SQL, the guards and the answers are the same objects either
way.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg import sql

T = TypeVar("T")
Rows = list[list[tuple[Any, ...]]]
Step = tuple["Statement", dict[str, Any]]
AnyConnection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]


class Statement:
    """One named statement; ``params`` are (name, SQL type) in ``$n`` order, used as ``%(name)s`` in ``sql``."""

    def __init__(self, label: str, sql: str, params: Sequence[tuple[str, str]]) -> None:
        numbered = sql
        for i, (name, _) in enumerate(params, 1):
            numbered = numbered.replace(f"%({name})s", f"${i}")
        if "%(" in numbered:
            raise ValueError(f"statement {label}: a %(name)s placeholder is not among its params")
        # Named after the text, so a session never runs a stale version of it.
        self.label = label
        self.sql = sql
        self.name = f"gantry_{label}_" + hashlib.sha256(numbered.encode()).hexdigest()[:12]
        self.params = tuple(name for name, _ in params)
        self.types = tuple(t for _, t in params)
        self.prepare_sql = f"PREPARE {self.name} ({', '.join(t for _, t in params)}) AS {numbered}"
        # The sessions (sync or asyncio connections) that have it prepared.
        self._prepared_on: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"Statement({self.name})"

    def ensure_prepared(self, conn: psycopg.Connection[Any]) -> None:
        if conn not in self._prepared_on:
            conn.execute(self.prepare_sql)
            self._prepared_on[conn] = True

    async def aensure_prepared(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if conn not in self._prepared_on:
            await conn.execute(self.prepare_sql)
            self._prepared_on[conn] = True

    def forget(self, conn: AnyConnection) -> None:
        self._prepared_on.pop(conn, None)


# The SQL type of each parameter name, for statements built with :func:`named`:
# one name means one thing (and one type) in every statement.
TYPES = {
    "run": "uuid",
    "ids": "uuid[]",
    "runner": "uuid",
    "runners": "uuid[]",
    "reason": "text",
    "reasons": "text[]",
    "now": "timestamptz",
    "detail": "jsonb",
    "target": "text",
    "event": "text",
    "expected": "text[]",
    "deadline": "timestamptz",
    "grp": "bigint",
    "digest": "text",
    "expires": "timestamptz",
    "stack": "bigint",
    "stacks": "bigint[]",
    "org": "bigint",
    "version": "bigint",
    "rate": "integer",
    "hostname": "text",
    "launcher": "text",
    "pid": "integer",
    "container_id": "text",
    "pod_name": "text",
    "workflow_run_id": "bigint",
    "bound": "boolean",
    "group": "bigint",
    "stale": "timestamptz",
    "limit": "integer",
    "aging": "integer",
}

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def named(label: str, sql: str, types: Mapping[str, str] | None = None) -> Statement:
    """A Statement whose parameters are the ``%(name)s`` of ``sql``, typed from ``types`` or else :data:`TYPES`."""
    names = list(dict.fromkeys(_PLACEHOLDER.findall(sql)))
    own = types or {}
    return Statement(label, sql, [(name, own.get(name) or TYPES[name]) for name in names])


@dataclass(frozen=True, slots=True)
class Script:
    """The statements of one round trip.

    ``steps`` are one transaction (``BEGIN … COMMIT`` in autocommit), or a
    single statement that is its own transaction when ``transaction`` is
    False. ``before`` run first, outside that transaction (a read whose
    answer decides whether the transaction stands: the claim's group check).
    ``commit=False`` leaves the transaction open for the caller to end with
    :func:`end` (the claim spends its throttle token between the two).
    """

    steps: Sequence[Step]
    synchronous_commit: bool = True
    transaction: bool = True
    before: Sequence[Step] = ()
    commit: bool = True


@dataclass(frozen=True, slots=True)
class AfterCommit:
    """Work for after the plan's writes have committed (Django's on_commit; at once in autocommit)."""

    func: Callable[[], object]


Plan = Generator[Script | AfterCommit, Any, T]


# ---------------------------------------------------------------- one message


# Inside a caller's transaction a script runs in a savepoint of its own,
# opened and released in the same message (no extra round trip): a session
# that lost its prepared statements then rolls back to it and sends the
# script again, instead of aborting the caller's whole transaction.
_SAVEPOINT = "gantry_script"


OWN, ALONE, NESTED = "own", "alone", "nested"


def _mode(script: Script, *, autocommit: bool) -> str:
    """How the message runs: its own transaction (BEGIN … COMMIT), a single statement alone, or in a savepoint."""
    if not autocommit:
        return NESTED
    return OWN if script.transaction else ALONE


def _text(conn: AnyConnection, script: Script, mode: str) -> tuple[str, int, int]:
    """The one message for ``script``, and the empty results before ``before``'s rows and before ``steps``' rows."""
    before = [execute_text(statement, args, conn) for statement, args in script.before]
    parts = [execute_text(statement, args, conn) for statement, args in script.steps]
    if mode == OWN:
        begin = ["BEGIN"] if script.synchronous_commit else ["BEGIN", "SET LOCAL synchronous_commit = off"]
        end = ["COMMIT"] if script.commit else []
        return "; ".join([*before, *begin, *parts, *end]), 0, len(begin)
    if mode == NESTED:
        return "; ".join([f"SAVEPOINT {_SAVEPOINT}", *before, *parts, f"RELEASE SAVEPOINT {_SAVEPOINT}"]), 1, 0
    return "; ".join([*before, *parts]), 0, 0


def _has_rows(cur: psycopg.ClientCursor[Any] | psycopg.AsyncClientCursor[Any]) -> bool:
    # The result's status, not cur.description, which builds a Column object
    # for each of the result's columns: accept's and done's are twenty-odd wide.
    result = cur.pgresult
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


def _lost(exc: BaseException, conn: AnyConnection, script: Script) -> bool:
    """Whether ``exc`` says the session lost its prepared statements; if so, each is forgotten (prepared again next).

    Someone ran ``DISCARD ALL`` or ``DEALLOCATE`` on the session (a pooler
    between transactions, an operator): the script is sent once more.
    """
    if not isinstance(exc, psycopg.errors.InvalidSqlStatementName):
        return False
    for statement, _ in (*script.before, *script.steps):
        statement.forget(conn)
    return True


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.rollback()


async def _arollback(conn: psycopg.AsyncConnection[Any]) -> None:
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        await conn.rollback()


# ---------------------------------------------------------------- Django's connection


def _django() -> tuple[Any, psycopg.Connection[Any]]:
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    return db, db.connection


def run_script(script: Script) -> Rows:
    """Send ``script`` on Django's connection in one round trip; the rows of ``before`` and ``steps``, in order.

    In autocommit the steps are their own transaction; inside a caller's
    transaction (an ``atomic`` block, a test) they run in it, in a savepoint
    of their own, and the caller commits. An error rolls back what the message
    began and is raised as Django's database error.
    """
    db, conn = _django()
    mode = _mode(script, autocommit=db.get_autocommit() and not db.in_atomic_block)
    with db.wrap_database_errors:
        try:
            return _send(conn, script, mode)
        except psycopg.Error as exc:
            if not _lost(exc, conn, script):
                raise
            if mode == NESTED:
                conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}; RELEASE SAVEPOINT {_SAVEPOINT}")
            return _send(conn, script, mode)


def _send(conn: psycopg.Connection[Any], script: Script, mode: str) -> Rows:
    for statement, _ in (*script.before, *script.steps):
        statement.ensure_prepared(conn)
    text, lead, mid = _text(conn, script, mode)
    out: Rows = []
    with psycopg.ClientCursor(conn) as cur:
        try:
            cur.execute(text)  # no parameters: the literals are in the text
            for _ in range(lead):
                cur.nextset()  # past SAVEPOINT's empty result
            for _ in script.before:
                out.append(cur.fetchall() if _has_rows(cur) else [])
                cur.nextset()
            for _ in range(mid):
                cur.nextset()  # past BEGIN's (and SET's) empty result
            for _ in script.steps:
                out.append(cur.fetchall() if _has_rows(cur) else [])
                cur.nextset()
        except BaseException:
            if mode == OWN:
                _rollback(conn)
            raise
    return out


def end(*, commit: bool) -> None:
    """End the transaction a ``commit=False`` script opened on Django's connection (nothing inside a caller's)."""
    db, conn = _django()
    if not db.get_autocommit() or db.in_atomic_block:
        return
    with db.wrap_database_errors:
        if commit:
            conn.commit()
        else:
            _rollback(conn)


def fetchone(statement: Statement, args: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """EXECUTE one statement on Django's connection (one round trip, its own transaction); its first row."""
    rows = run_script(Script([(statement, dict(args))], transaction=False))[0]
    return rows[0] if rows else None


def fetchall(statement: Statement, args: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """EXECUTE one statement on Django's connection (one round trip, its own transaction); its rows."""
    return run_script(Script([(statement, dict(args))], transaction=False))[0]


def drive(plan: Plan[T]) -> T:
    """Run ``plan`` on Django's connection: each Script through :func:`run_script`; its result."""
    try:
        step = next(plan)
        while True:
            if isinstance(step, AfterCommit):
                transaction.on_commit(step.func)
                step = plan.send(None)
            else:
                step = plan.send(run_script(step))
    except StopIteration as stop:
        return stop.value


# ---------------------------------------------------------------- an asyncio connection (the fast lane's)


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
    if not script.commit:
        raise ValueError("an asyncio script ends its own transaction")
    try:
        return await _asend(conn, script)
    except psycopg.Error as exc:
        if not _lost(exc, conn, script):
            raise
        return await _asend(conn, script)


async def _asend(conn: psycopg.AsyncConnection[Any], script: Script) -> Rows:
    for statement, _ in (*script.before, *script.steps):
        await statement.aensure_prepared(conn)
    text, _, mid = _text(conn, script, _mode(script, autocommit=True))
    out: Rows = []
    async with psycopg.AsyncClientCursor(conn) as cur:
        try:
            await cur.execute(text)
            for _ in script.before:
                out.append(await cur.fetchall() if _has_rows(cur) else [])
                cur.nextset()
            for _ in range(mid):
                cur.nextset()
            for _ in script.steps:
                out.append(await cur.fetchall() if _has_rows(cur) else [])
                cur.nextset()
        except BaseException:
            await _arollback(conn)
            raise
    return out


# ---------------------------------------------------------------- the EXECUTE's literals
#
# EXECUTE takes its arguments as literals in the statement's text. psycopg's
# client-side binding (ClientCursor with parameters) finds the placeholders,
# picks a dumper and quotes through libpq for every value of every call, which
# costs more than the rest of a hot call's client side. The statement knows
# each parameter's SQL type, so the common values are written here directly;
# anything else (a type or value not handled below) is quoted by psycopg.
# Strings are E'' literals with backslashes and quotes doubled, read the same
# whatever standard_conforming_strings says.


def execute_text(statement: Statement, args: Mapping[str, Any], conn: AnyConnection) -> str:
    """``EXECUTE name (literal, ...)`` for ``args``, each written as a literal of its parameter's type."""
    values = ", ".join(
        literal(args[name], kind, conn) for name, kind in zip(statement.params, statement.types, strict=True)
    )
    return f"EXECUTE {statement.name} ({values})" if values else f"EXECUTE {statement.name}"


def literal(value: Any, kind: str, conn: AnyConnection) -> str:
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
        return _quoted(value)
    if cls is datetime and value.tzinfo is not None:
        return f"'{value.isoformat()}'"
    if kind == "jsonb" and cls is not str:
        return literal(json.dumps(value), kind, conn)  # the EXECUTE casts the text to jsonb
    if cls is list and kind == "text[]" and all(type(v) is str and "\x00" not in v for v in value):
        return f"ARRAY[{', '.join(_quoted(v) for v in value)}]::text[]"
    # Anything else (a NUL in a string, a naive datetime, another type):
    # psycopg's own quoting, and its error for what PostgreSQL cannot hold.
    return sql.Literal(value).as_string(conn)


def _quoted(value: str) -> str:
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
