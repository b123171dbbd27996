"""The poll's claim (docs/design.md §5, "Phase 1: Poll"): one statement (gantry.sql.claim), the throttle, the commit.

Round trips, because a claim is mostly waiting (docs/performance.md): the
statement is prepared once per session (gantry.sql.statement); BEGIN travels
in one message with its EXECUTE; then the throttle's one Redis call; then
COMMIT, which does not wait for the WAL flush (docs/decisions.md, 13: the
claim is tentative, and accept's durable commit flushes past it). Two database
round trips and one Redis round trip for a won claim, two database round trips
for an empty poll. A busy org's claim takes its token first and sends COMMIT in
the statement's own message: one Redis and one database round trip ("taking
the token ahead" below). Called inside someone else's transaction (a test, a
batch), the claim takes a savepoint instead and leaves the commit to the caller.

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

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.utils import timezone

from gantry import conf, metrics
from gantry.core import tokens
from gantry.core.models import Organization, Priority, RunnerGroup
from gantry.dispatch import throttle
from gantry.sql.claim import CLAIM, STAMP_THROTTLED
from gantry.sql.statement import Rows, Script, Statement, end, run_script

log = logging.getLogger("gantry.dispatch")


@dataclass(frozen=True)
class Claim:
    run_id: uuid.UUID
    runner_id: uuid.UUID
    runner_token: str
    assigned_expires_at: datetime


@dataclass(frozen=True)
class Vouch:
    """A read that proves the caller may claim for the group, sent in the claim's own message.

    The fast lane's poll holds a group token that names its org, so it need
    not read the group before claiming: its authentication read goes in front
    of BEGIN in the claim's message (one round trip instead of two, the
    Script's ``before``) and ``check`` judges its row after the claim
    statement ran, before the throttle. A check that raises rolls the claim
    back (the run, the stub and the poll's stamp were never visible) and its
    exception reaches the caller.
    """

    statement: Statement
    args: dict[str, Any]
    check: Callable[[tuple[Any, ...] | None], None]
    # The token's version. With it the claim statement judges what ``check``
    # does (the version, the org, a self-hosted group) on the group row it
    # locks, so a claim whose token was taken ahead can commit in its own
    # message; ``check`` then only names the refusal. None: ``check`` alone.
    token_version: int | None = None

    def steps(self) -> list[tuple[Statement, dict[str, Any]]]:
        return [(self.statement, self.args)]


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


# A throttled poll's contact stamp is written at most this often per group
# (:func:`_stamp_throttled`): the poll is the hot path, and the groups page
# calls a group silent only after conf poll_stale_after (60 s by default).
THROTTLED_CONTACT_SECONDS = 5


def _stamp_throttled(exc: Throttled, *, group_id: int | None = None, now: datetime | None = None) -> None:
    """Defer the org until its next token: best-effort, in its own transaction, never failing the poll.

    Guarded on the rate the claim used: a rate change clears the stamp (the
    projection was made at the old rate), and a stamp computed at the old rate
    must not land after that clear. A stamp that is merely late or lost costs
    nothing: the bucket stays authoritative, the next throttled poll re-stamps.

    With ``group_id``, the same statement stamps the group's ``last_polled_at``:
    the rollback undid the claim's own stamp, and a throttled poll is still a
    coordinator in contact (else the groups page calls it silent). At most
    every THROTTLED_CONTACT_SECONDS, so a throttled org's polls add no write
    of the group row per poll, and no round trip (one statement as before).
    """
    try:
        with transaction.atomic():
            if group_id is None:
                Organization.objects.filter(id=exc.organization_id, runs_per_hour_limit=exc.runs_per_hour_limit).update(
                    dispatch_throttled_until=exc.until
                )
            else:
                now = now or timezone.now()
                with connections[DEFAULT_DB_ALIAS].cursor() as cur:
                    cur.execute(
                        STAMP_THROTTLED,
                        {"org": exc.organization_id, "rate": exc.runs_per_hour_limit, "until": exc.until,
                         "grp": group_id, "now": now, "since": now - timedelta(seconds=THROTTLED_CONTACT_SECONDS)},
                    )  # fmt: skip
    except DatabaseError as err:
        log.warning(
            "could not stamp dispatch_throttled_until",
            extra={"event": "throttle.stamp_failed", "organization_id": exc.organization_id, "error": repr(err)},
        )


def _first(rows: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    return rows[0] if rows else None


def _vouched(vouch: Vouch | None, rows: Rows) -> None:
    """Judge the vouch's read (the message's first result) once the claim statement ran."""
    if vouch is not None:
        vouch.check(_first(rows[0]))


def _claim_own_transaction(
    args: dict[str, Any], *, organization_id: int, now: datetime, vouch: Vouch | None = None
) -> tuple[tuple[Any, ...] | None, throttle.Outcome | None]:
    """BEGIN + EXECUTE in one message, the throttle, then COMMIT (or ROLLBACK): two database round trips.

    A busy org's claim takes its token ahead instead and sends COMMIT in the
    same message (:func:`_claim_taken_ahead`): one round trip.
    """
    if vouch is None or vouch.token_version is not None:
        ahead = _take_ahead(organization_id)
        if ahead is not None:
            row = _claim_taken_ahead(args, organization_id=organization_id, rate=ahead, vouch=vouch)
            if row is not None:
                return row, throttle.DISPATCHED
            # Nothing claimed (no run, or the rate changed since): the token is
            # back; the ordinary claim below tells which, and names a refusal.
    before = vouch.steps() if vouch is not None else []
    try:
        rows = run_script(Script([(CLAIM, args)], synchronous_commit=False, before=before, commit=False))
        _vouched(vouch, rows)
        row = _first(rows[-1])
        outcome = None
        if row is not None:
            outcome = _consume_dispatch_token(organization_id=organization_id, now=now, runs_per_hour_limit=row[1])
    except BaseException:
        # Throttled included: the run is pending again and the stub never existed.
        _rollback_quietly()
        raise
    end(commit=True)  # also for an empty poll: its last_polled_at stamp
    return row, outcome


def _rollback_quietly() -> None:
    """End the transaction the claim opened, without hiding the error that interrupted it."""
    try:
        end(commit=False)
    except DatabaseError as exc:
        log.warning("rollback after a failed claim failed", extra={"event": "claim.rollback", "error": repr(exc)})


def _claim_taken_ahead(
    args: dict[str, Any], *, organization_id: int, rate: int, vouch: Vouch | None
) -> tuple[Any, ...] | None:
    """The claim of a token taken ahead at ``rate``, committed in its own message; the won row, or None.

    The statement judges the rate and the vouch's group check itself (its
    ``held`` and ``eligible`` steps), so nothing is decided between it and
    COMMIT. None: nothing was claimed or written but the poll's stamp (none
    for a refused group check), and the token was given back.
    """
    ahead = {**args, "version": vouch.token_version if vouch is not None else None, "rate": rate}
    before = vouch.steps() if vouch is not None else []
    row = None
    try:
        # The vouch's row is not judged here: the ordinary claim reads it again if it matters.
        rows = run_script(Script([(CLAIM, ahead)], synchronous_commit=False, before=before))
        row = _first(rows[-1])
    finally:
        if row is None:
            throttle.refund(organization_id=organization_id, rate=rate)
            _ahead.pop(organization_id, None)
    return row


def _claim_in_callers_transaction(
    args: dict[str, Any], *, organization_id: int, now: datetime, vouch: Vouch | None = None
) -> tuple[tuple[Any, ...] | None, throttle.Outcome | None]:
    """Inside a caller's atomic block: a savepoint, so a throttled or refused claim undoes only itself."""
    with transaction.atomic():
        rows = run_script(Script([(CLAIM, args)], before=vouch.steps() if vouch is not None else []))
        _vouched(vouch, rows)
        row = _first(rows[-1])
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
    args = {"now": now, "grp": group.id, "org": group.organization_id, "runner": runner_id, "expires": expires,
            "version": None, "rate": None, "aging": conf.get().priority_aging_seconds}  # fmt: skip
    db = connections[DEFAULT_DB_ALIAS]
    # A request (the poll) runs in autocommit: the claim opens and ends its own
    # transaction. Anyone already inside a transaction gets a savepoint.
    own = db.get_autocommit() and not db.in_atomic_block
    run_claim = _claim_own_transaction if own else _claim_in_callers_transaction
    try:
        row, outcome = run_claim(args, organization_id=group.organization_id, now=now, vouch=vouch)
    except Throttled as exc:
        throttle.record(throttle.LIMITED)
        _stamp_throttled(exc, group_id=group.id, now=now)
        if raise_throttled:
            raise
        return None
    if row is None or outcome is None:
        return None  # no run, or lost the race: Redis was never asked
    throttle.record(outcome)
    if row[2] is not None:
        metrics.record_claim(
            organization_id=group.organization_id,
            group_id=group.id,
            priority=Priority(row[3]).label,
            waited=(now - row[2]).total_seconds(),
            at=now.timestamp(),
        )
    return Claim(
        run_id=row[0],
        runner_id=runner_id,
        runner_token=tokens.mint_runner_token(runner_id=runner_id, run_id=row[0], group_id=group.id),
        assigned_expires_at=expires,
    )
