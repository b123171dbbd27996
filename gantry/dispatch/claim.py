"""The poll's claim (docs/design.md §5, "Phase 1: Poll").

One SQL statement does the whole claim: lock the group row, check drain and
capacity, find the org's selectors the group can serve, probe the pending-run
index once per selector, lock the oldest candidate ``FOR UPDATE SKIP LOCKED``,
insert the not_ready stub runner, assign the run with a lease, write its event,
and write the group row once: its ``last_polled_at`` stamp and the stub in its
slot count. The throttle seam then runs inside the same transaction, before
commit (see "The throttle" below).

Round trips, because a claim is mostly waiting (docs/performance.md): the
statement is prepared once per session; BEGIN travels in one message with its
EXECUTE; then the throttle's one Redis call; then COMMIT, which does not wait
for the WAL flush (the claim is tentative; see _BEGIN_AND_EXECUTE_SQL). Two database round
trips and one Redis round trip for a won claim, two database round trips for
an empty poll. A busy org's claim takes its token first and sends COMMIT in
the statement's own message: one Redis and one database round trip ("taking
the token ahead" below). Called inside someone else's transaction (a test, a batch), the
claim takes a savepoint instead and leaves the commit to the caller.

Why it stays flat at any backlog (docs/performance.md): the statement never
reads a run the group cannot take. ``run_selector`` holds an org's *distinct*
selectors, so ``selector <@ labels`` runs over a handful of rows; each matching
selector is then one probe of the partial index ``run_claimable_idx`` on
(organization, selector, first_pending_at, id) WHERE status = 'pending' AND
assigned_runner_id IS NULL, taking its oldest ``CANDIDATES_PER_SELECTOR``
runs. Their union is small; the oldest unlocked one wins.

Why ``assigned_runner_id IS NULL`` is the whole "names a live runner" test:
the pointer's foreign key is ON DELETE SET NULL, so a non-null pointer always
names an existing runner row, and a runner row is live until deregister or a
reaper deletes it (which nulls the pointer). A lapsed lease keeps the pointer
(One Runner Per Run), so the run stays out of dispatch while its first runner
may still be booting.

Why the group row is locked: a group's runner rows are its slots. Two polls of
one group could both see ``max - 1`` rows and both insert. Counting rows in the
statement would not help: under READ COMMITTED a poll that waited for the other
still reads the runner table as of its own start. So the count lives on the
group row (``runner_count``), and the statement begins by locking that row
``FOR NO KEY UPDATE``: a waiting poll then reads the row's latest version, the
other poll's stub counted. The claim counts its own stub in the same write as
its stamp (the stub carries ``claim_counted``, so the insert trigger that
counts every other runner row skips it): one new version of the group row per
poll, not two. Concurrent polls of *one* group take turns for the few hundred
microseconds of the claim; polls of different groups never wait on each other.
Run rows are never waited on: SKIP LOCKED passes over a run another poll is
claiming.

The throttle (docs/design.md, "Per-org runs/hour throttle"): once the statement has
won a run, and before commit, one token of the org's budget is spent
(``gantry.dispatch.throttle``). After the claim, not before, so polls that lost
the race never spend one: the budget counts runs dispatched, not polls. The
statement also answers the org's ``runs_per_hour_limit`` (a primary-key read of
a row the statement already joins), so the bucket always refills at the rate in
force, with no extra round trip. An empty bucket raises ``Throttled`` inside the
transaction: the run is pending again and the stub never existed. Then, in a
transaction of its own, the org's ``dispatch_throttled_until`` is stamped with
the bucket's next refill, a hint the backend dispatcher uses to skip the org.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.utils import timezone

from gantry import conf, metrics
from gantry.core import prepared, tokens
from gantry.core.models import Organization, RunnerGroup
from gantry.dispatch import throttle

log = logging.getLogger("gantry.dispatch")

# Candidates read per matching selector. With k concurrent pollers on one
# selector, a top-1 probe answers empty while work exists most of the time
# (each poller sees the same locked head); 32 measured no false empties at 8
# pollers. A literal, not a parameter, so the plan never depends on it.
CANDIDATES_PER_SELECTOR = 32

_CLAIM_SQL = f"""
WITH grp AS (
    -- Locks the group row; a poll that waited for another poll of this group
    -- reads the row version that poll wrote, its stub counted.
    SELECT id, labels, runner_count, max_concurrent_runs, drained, token_version, organization_id, kind
    FROM runner_group
    WHERE id = %(group_id)s::bigint
    FOR NO KEY UPDATE
),
held AS (
    -- The caller's group check (Vouch), judged again on the locked row when
    -- the claim commits in its own message: the token's version, its org, a
    -- self-hosted group. A NULL version: the caller judges it before commit.
    SELECT grp.id FROM grp
    WHERE %(version)s::bigint IS NULL
       OR (grp.token_version = %(version)s::bigint AND grp.organization_id = %(org_id)s::bigint
           AND grp.kind <> 'github_actions')
),
eligible AS (
    -- runner_count comes from the locked, latest row version (a poll that
    -- waited for another poll of this group sees that poll's stub counted).
    SELECT grp.id, grp.labels FROM grp JOIN held ON TRUE
    WHERE NOT grp.drained AND grp.runner_count < grp.max_concurrent_runs
      -- A token taken ahead at this rate: a rate changed since claims nothing
      -- here (the caller claims again the ordinary way). NULL: not checked.
      AND (%(rate)s::integer IS NULL OR EXISTS (
          SELECT 1 FROM organization o WHERE o.id = %(org_id)s::bigint AND o.runs_per_hour_limit = %(rate)s::integer))
),
sel AS (
    SELECT s.id FROM run_selector s
    JOIN eligible e ON TRUE
    JOIN organization o ON o.id = s.organization_id
    WHERE s.organization_id = %(org_id)s::bigint
      AND s.selector <@ e.labels
      -- an empty selector goes to the org's default group, or anywhere without one
      AND (s.selector <> '{{}}'::jsonb OR o.default_runner_group_id IS NULL OR o.default_runner_group_id = e.id)
),
candidate AS (
    -- first_pending_at comes out of the index with the id, so the candidates
    -- are ordered before they touch the run table (below).
    SELECT c.id, c.first_pending_at FROM sel CROSS JOIN LATERAL (
        SELECT r.id, r.first_pending_at FROM run r
        WHERE r.organization_id = %(org_id)s::bigint AND r.selector_id = sel.id
          AND r.status = 'pending' AND r.assigned_runner_id IS NULL
        ORDER BY r.first_pending_at, r.id
        LIMIT {CANDIDATES_PER_SELECTOR}
    ) c
),
picked AS (
    -- Oldest candidate first, one run row at a time, stopping at the first
    -- row it can lock (one primary-key probe, not one per candidate).
    -- Re-checked on the locked row version: a run claimed meanwhile drops out.
    SELECT r.id FROM (SELECT id, first_pending_at FROM candidate ORDER BY first_pending_at, id) c
    JOIN run r ON r.id = c.id
    WHERE r.status = 'pending' AND r.assigned_runner_id IS NULL
    ORDER BY c.first_pending_at, c.id
    LIMIT 1
    FOR UPDATE OF r SKIP LOCKED
),
stub AS (
    -- claim_counted: counted below, in the stamp, not by the insert trigger.
    INSERT INTO runner (id, runner_group_id, status, created_at, hostname, launcher, container_id, pod_name,
                        claim_counted)
    SELECT %(runner_id)s::uuid, %(group_id)s::bigint, 'not_ready', %(now)s::timestamptz, '', '', '', '', TRUE
    FROM picked
    RETURNING id
),
assigned AS (
    UPDATE run SET status = 'assigned', assigned_runner_id = stub.id, assigned_at = %(now)s,
                   assigned_expires_at = %(expires)s, updated_at = %(now)s
    FROM picked, stub
    WHERE run.id = picked.id
    RETURNING run.id, run.first_pending_at
),
event AS (
    INSERT INTO run_event (run_id, at, kind, detail)
    SELECT assigned.id, %(now)s, 'assigned',
           jsonb_build_object('runner_id', %(runner_id)s::text, 'runner_group_id', %(group_id)s::bigint)
    FROM assigned
),
stamp AS (
    -- One write of the group row per poll, won or empty: the poll's stamp and
    -- its stub (if any) in the slot count. The row is locked by grp above.
    -- Not for a refused group check: a refused call writes nothing.
    UPDATE runner_group SET last_polled_at = %(now)s, runner_count = runner_count + (SELECT count(*) FROM stub)
    WHERE id = %(group_id)s::bigint AND EXISTS (SELECT 1 FROM held)
)
-- The rate comes back with the run: the throttle needs it, and reading it here
-- costs no round trip.
-- first_pending_at: for the pending -> claimed histogram, recorded after commit.
SELECT assigned.id, o.runs_per_hour_limit, assigned.first_pending_at
FROM assigned JOIN organization o ON o.id = %(org_id)s::bigint
"""

# The statement is PREPAREd once per database session and then EXECUTEd:
# parsing and planning this CTE chain cost more than running it
# (docs/performance.md, P1). EXECUTE is sent with BEGIN in one simple-query
# message, so opening the transaction costs no round trip of its own (P4).
# The parameter types are fixed here, so the plan never depends on the values.
_PARAMETERS = (
    ("now", "timestamptz"),
    ("group_id", "bigint"),
    ("org_id", "bigint"),
    ("runner_id", "uuid"),
    ("expires", "timestamptz"),
    ("version", "bigint"),
    ("rate", "integer"),
)


def _numbered(sql: str) -> str:
    for i, (name, _) in enumerate(_PARAMETERS, 1):
        sql = sql.replace(f"%({name})s", f"${i}")
    return sql


# Named after the text, so a session never runs a stale version of the statement.
STATEMENT_NAME = "gantry_claim_" + hashlib.sha256(_CLAIM_SQL.encode()).hexdigest()[:12]
_PREPARE_SQL = f"PREPARE {STATEMENT_NAME} ({', '.join(t for _, t in _PARAMETERS)}) AS {_numbered(_CLAIM_SQL)}"
_EXECUTE_SQL = f"EXECUTE {STATEMENT_NAME} ({', '.join('%s' for _ in _PARAMETERS)})"
# The claim's own transaction commits without waiting for its WAL flush
# (docs/decisions.md, 13). The claim is tentative: a runner can only make it
# authoritative through accept, whose synchronous commit flushes the WAL up to
# and past the claim's. So a claim can be lost only in a database crash within
# the flush window (wal_writer_delay), before any accept could have built on
# it; its runner is then refused at ready/accept (its row is gone) and the run
# is pending again. SET LOCAL ends with the transaction.
_BEGIN_AND_EXECUTE_SQL = f"BEGIN; SET LOCAL synchronous_commit = off; {_EXECUTE_SQL}"
# A claim whose token was taken ahead (and whose group check, if any, the
# statement judges itself): nothing is left to decide in Python, so COMMIT
# travels in the same message and the group row is locked for the statement
# and its commit alone.
_BEGIN_EXECUTE_COMMIT_SQL = f"{_BEGIN_AND_EXECUTE_SQL}; COMMIT"

# The sessions the statement is prepared on (psycopg connections, pooled and
# reused; a closed one drops out by itself).
_prepared_on: weakref.WeakKeyDictionary[psycopg.Connection[Any], bool] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Claim:
    run_id: uuid.UUID
    runner_id: uuid.UUID
    runner_token: str
    assigned_expires_at: datetime


@dataclass(frozen=True)
class Vouch:
    """A read that proves the caller may claim for the group, sent in the claim's own message.

    The fast lane's poll (gantry/api/fastlane.py) holds a group token that
    names its org, so it need not read the group before claiming: its
    authentication read goes in front of BEGIN in the claim's message (one
    round trip instead of two) and ``check`` judges its row after the claim
    statement ran, before the throttle. A check that raises rolls the claim
    back (the run, the stub and the poll's stamp were never visible) and its
    exception reaches the caller.
    """

    statement: prepared.Statement
    args: dict[str, Any]
    check: Callable[[tuple[Any, ...] | None], None]
    # The token's version. With it the claim statement judges what ``check``
    # does (the version, the org, a self-hosted group) on the group row it
    # locks, so a claim whose token was taken ahead can commit in its own
    # message; ``check`` then only names the refusal. None: ``check`` alone.
    token_version: int | None = None

    def sql(self) -> str:
        return self.statement.execute_sql

    def params(self) -> list[Any]:
        return [self.args[name] for name in self.statement.params]


class Throttled(Exception):
    """The org's dispatch budget is spent; the claim was rolled back.

    ``claim()`` answers None for it (a poll answers 204 either way); a caller
    that must tell it from "no work", such as a dispatcher that should stop the
    org for the tick instead of trying its next run, passes
    ``raise_throttled=True`` and gets this, with ``until`` = the next refill.
    """

    def __init__(self, *, organization_id: int, runs_per_hour_limit: int, until: datetime) -> None:
        super().__init__(f"organization {organization_id} is throttled until {until.isoformat()}")
        self.organization_id = organization_id
        self.runs_per_hour_limit = runs_per_hour_limit
        self.until = until


# ---------------------------------------------------------------- taking the token ahead
#
# A won claim holds its group's row lock until it commits. Spending the token
# after the statement (above) puts the throttle's Redis round trip, and the
# thread's turns for the GIL around it, inside that lock: every other poll and
# deregister of the group waits for them. So a process that has just seen an
# org dispatch, with tokens to spare, spends the org's next token *before* the
# claim statement, at the rate the claim last read; the lock then spans the
# statement and its COMMIT alone. The claim's answer still decides:
#
# - a run won: dispatched. The statement itself checks that the org's rate is
#   still the one the token was taken at, and, for a Vouch, judges the group
#   check on the row it locks (its ``held`` step), so nothing is left to decide
#   between it and COMMIT, which travels in the same message;
# - nothing claimed (no run, a rate changed since, a refused group check) or
#   any error: the token is given back, and the ordinary claim runs once more:
#   it spends at the new rate (rate 0 included), names a refusal, or answers
#   empty. So a new rate still applies to the very next claim.
#
# Only while the org's bucket held at least AHEAD_MARGIN tokens after this
# process's last take: a token in flight for a claim that finds nothing is
# invisible to other claims for those milliseconds, and near an empty bucket
# that could refuse one of them (and stamp the org throttled) for nothing.
# And only after this process's last claim of the org won a run, so idle
# polls (empty, most of them) never take and refund. docs/throttle.md,
# "Taking the token ahead".

AHEAD_MARGIN = 8.0

# org id -> (the rate its last won claim read, tokens left after that claim's take).
_ahead: dict[int, tuple[int, float]] = {}


def forget_taken_ahead() -> None:
    """Drop what this process remembers of orgs' buckets (tests that reset buckets call this)."""
    _ahead.clear()


def _remember(organization_id: int, rate: int, tokens_left: float | None) -> None:
    if tokens_left is None:
        _ahead.pop(organization_id, None)
    else:
        _ahead[organization_id] = (rate, tokens_left)


def _take_ahead(organization_id: int) -> int | None:
    """Spend the org's next token now, when that is safe; the rate it was taken at, or None (none taken)."""
    known = _ahead.get(organization_id)
    if known is None or known[1] < AHEAD_MARGIN:
        return None
    rate = known[0]
    bucket = throttle.take_ahead(organization_id=organization_id, rate=rate)
    if bucket is None:
        _ahead.pop(organization_id, None)
        return None
    _remember(organization_id, rate, bucket.tokens)
    return rate


def _consume_dispatch_token(*, organization_id: int, now: datetime, runs_per_hour_limit: int) -> throttle.Outcome:
    """The throttle seam: spend one token of the org's runs/hour budget or raise Throttled.

    Called after the claim won its row and before commit, so a poll that lost
    the SKIP LOCKED race never spends a token. ``runs_per_hour_limit`` is the
    rate the claim's statement read with the run (no query of its own). Answers
    the outcome to count once the transaction commits (dispatched, or
    failed_open when Redis could not answer and the run goes out anyway).
    """
    decision = throttle.consume(organization_id=organization_id, rate=runs_per_hour_limit)
    _remember(organization_id, runs_per_hour_limit, decision.tokens)
    if decision.outcome == throttle.LIMITED:
        raise Throttled(
            organization_id=organization_id,
            runs_per_hour_limit=runs_per_hour_limit,
            until=throttle.throttled_until(now=now, ms_to_next_token=decision.ms_to_next_token),
        )
    return decision.outcome


def _stamp_throttled(exc: Throttled) -> None:
    """Defer the org until its next token: best-effort, in its own transaction, never failing the poll.

    Guarded on the rate the claim used: a rate change clears the stamp (the
    projection was made at the old rate), and a stamp computed at the old rate
    must not land after that clear. A stamp that is merely late or lost costs
    nothing: the bucket stays authoritative, the next throttled poll re-stamps.
    """
    try:
        with transaction.atomic():
            Organization.objects.filter(id=exc.organization_id, runs_per_hour_limit=exc.runs_per_hour_limit).update(
                dispatch_throttled_until=exc.until
            )
    except DatabaseError as err:
        log.warning(
            "could not stamp dispatch_throttled_until",
            extra={"event": "throttle.stamp_failed", "organization_id": exc.organization_id, "error": repr(err)},
        )


def _ensure_prepared(conn: psycopg.Connection[Any], vouch: Vouch | None = None) -> None:
    """PREPARE the claim (and the vouch's read) on this session, once (a prepared statement lives as long as the
    session)."""
    if conn not in _prepared_on:
        conn.execute(_PREPARE_SQL)
        _prepared_on[conn] = True
    if vouch is not None:
        vouch.statement.ensure_prepared(conn)


def _fetch_claim(
    cur: psycopg.ClientCursor[Any], *, begin: bool, args: tuple[Any, ...], vouch: Vouch | None = None
) -> tuple[Any, ...] | None:
    if begin and vouch is not None:
        # The read first: BEGIN then makes its implicit transaction the claim's.
        cur.execute(f"{vouch.sql()}; {_BEGIN_AND_EXECUTE_SQL}", [*vouch.params(), *args])
        vouched = cur.fetchone()
        cur.nextset()  # to BEGIN's empty result,
        cur.nextset()  # SET's,
        cur.nextset()  # and the claim's
        row = cur.fetchone()
        vouch.check(vouched)
        return row
    if begin:
        cur.execute(_BEGIN_AND_EXECUTE_SQL, args)
        cur.nextset()  # past BEGIN's empty result,
        cur.nextset()  # and SET's, to the claim's
    else:
        if vouch is not None:
            vouch.check(prepared.fetchone(vouch.statement, vouch.args))
        cur.execute(_EXECUTE_SQL, args)
    return cur.fetchone()


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    """End a transaction this module opened, without hiding the error that interrupted it."""
    if conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        conn.rollback()
    except psycopg.Error as exc:
        log.warning("rollback after a failed claim failed", extra={"event": "claim.rollback", "error": repr(exc)})


def _claim_own_transaction(
    conn: psycopg.Connection[Any],
    args: tuple[Any, ...],
    *,
    organization_id: int,
    now: datetime,
    vouch: Vouch | None = None,
) -> tuple[tuple[Any, ...] | None, throttle.Outcome | None]:
    """BEGIN + EXECUTE in one message, the throttle, then COMMIT (or ROLLBACK): two database round trips.

    A busy org's claim takes its token ahead instead and sends COMMIT in the
    same message (:func:`_claim_taken_ahead`): one round trip.
    """
    if vouch is None or vouch.token_version is not None:
        ahead = _take_ahead(organization_id)
        if ahead is not None:
            row = _claim_taken_ahead(conn, args, organization_id=organization_id, rate=ahead, vouch=vouch)
            if row is not None:
                return row, throttle.DISPATCHED
            # Nothing claimed (no run, or the rate changed since): the token is
            # back; the ordinary claim below tells which, and names a refusal.
    with psycopg.ClientCursor(conn) as cur:
        try:
            row = _fetch_claim(cur, begin=True, args=args, vouch=vouch)
            outcome = None
            if row is not None:
                outcome = _consume_dispatch_token(organization_id=organization_id, now=now, runs_per_hour_limit=row[1])
        except BaseException:
            # Throttled included: the run is pending again and the stub never existed.
            _rollback_quietly(conn)
            raise
    conn.commit()  # also for an empty poll: its last_polled_at stamp
    return row, outcome


def _claim_taken_ahead(
    conn: psycopg.Connection[Any], args: tuple[Any, ...], *, organization_id: int, rate: int, vouch: Vouch | None
) -> tuple[Any, ...] | None:
    """The claim of a token taken ahead at ``rate``, committed in its own message; the won row, or None.

    The statement judges the rate and the vouch's group check itself (its
    ``held`` and ``eligible`` steps), so nothing is decided between it and
    COMMIT. None: nothing was claimed or written but the poll's stamp (none
    for a refused group check), and the token was given back.
    """
    claim_args = (*args[:5], vouch.token_version if vouch is not None else None, rate)
    text, params = _BEGIN_EXECUTE_COMMIT_SQL, list(claim_args)
    if vouch is not None:
        text, params = f"{vouch.sql()}; {text}", [*vouch.params(), *params]
    row = None
    try:
        with psycopg.ClientCursor(conn) as cur:
            try:
                cur.execute(text, params)
                if vouch is not None:
                    cur.nextset()  # past the vouch's read (the ordinary claim reads it again if it matters)
                cur.nextset()  # past BEGIN's empty result,
                cur.nextset()  # and SET's, to the claim's
                row = cur.fetchone()
            except BaseException:
                _rollback_quietly(conn)  # an error inside the message leaves its transaction aborted
                raise
    finally:
        if row is None:
            throttle.refund(organization_id=organization_id, rate=rate)
            _ahead.pop(organization_id, None)
    return row


def _claim_in_callers_transaction(
    conn: psycopg.Connection[Any],
    args: tuple[Any, ...],
    *,
    organization_id: int,
    now: datetime,
    vouch: Vouch | None = None,
) -> tuple[tuple[Any, ...] | None, throttle.Outcome | None]:
    """Inside a caller's atomic block: a savepoint, so a throttled claim undoes only itself."""
    with transaction.atomic(), psycopg.ClientCursor(conn) as cur:
        row = _fetch_claim(cur, begin=False, args=args, vouch=vouch)
        if row is None:
            return None, None
        return row, _consume_dispatch_token(organization_id=organization_id, now=now, runs_per_hour_limit=row[1])


def claim(
    *, group: RunnerGroup, now: datetime | None = None, raise_throttled: bool = False, vouch: Vouch | None = None
) -> Claim | None:
    """Claim the oldest run ``group`` may take, or None when there is none (or the org is throttled).

    With ``raise_throttled`` a throttled claim raises :class:`Throttled` instead
    of answering None (after the rollback and the stamp, as always). With
    ``vouch``, its read rides in the claim's message and its check decides
    whether the claim stands (:class:`Vouch`); only ``group.id`` and
    ``group.organization_id`` are read here.
    """
    now = now or timezone.now()
    runner_id = uuid.uuid4()
    expires = now + timedelta(seconds=conf.get().assignment_ttl)
    args = (now, group.id, group.organization_id, runner_id, expires, None, None)
    db = connections[DEFAULT_DB_ALIAS]  # once: each access through django.db.connection is a lookup
    db.ensure_connection()
    conn = db.connection
    # A request (the poll) runs in autocommit: the claim opens and ends its own
    # transaction. Anyone already inside a transaction gets a savepoint.
    run_claim = (
        _claim_own_transaction if db.get_autocommit() and not db.in_atomic_block else _claim_in_callers_transaction
    )
    try:
        with db.wrap_database_errors:
            try:
                _ensure_prepared(conn, vouch)
                row, outcome = run_claim(conn, args, organization_id=group.organization_id, now=now, vouch=vouch)
            except psycopg.errors.InvalidSqlStatementName:
                # The session lost its prepared statements (DISCARD ALL or
                # DEALLOCATE by someone else): prepare again, claim once more.
                _prepared_on.pop(conn, None)
                if vouch is not None:
                    vouch.statement.forget(conn)
                _ensure_prepared(conn, vouch)
                row, outcome = run_claim(conn, args, organization_id=group.organization_id, now=now, vouch=vouch)
    except Throttled as exc:
        throttle.record(throttle.LIMITED)
        _stamp_throttled(exc)
        if raise_throttled:
            raise
        return None
    if row is None or outcome is None:
        return None  # no run, or lost the race: Redis was never asked
    throttle.record(outcome)
    if row[2] is not None:
        metrics.record_run(
            organization_id=group.organization_id, timings={"pending_to_claimed": (now - row[2]).total_seconds()}
        )
    return Claim(
        run_id=row[0],
        runner_id=runner_id,
        runner_token=tokens.mint_runner_token(runner_id=runner_id, run_id=row[0], group_id=group.id),
        assigned_expires_at=expires,
    )
