"""A run's life after it is created: assign, lease reset, accept, cancel, finish, fail, time out.

Each function takes one edge of the state machine (docs/design.md), a Move of
gantry/sql/runs.py: guarded, evented, and — when the run ends — promoting its
stack's next run, all in the edge's one statement. A refused edge changed
nothing, and its error is derived from the row state the statement judged
(``transitions.refusal``, or the edge's own explanation below). The poll's
claim (gantry.dispatch.claim) takes pending → assigned with the claim's own
selection and the same effects.

The runner's hot edges (accept, done) are *plans* (gantry.sql.statement): the
one path both the Django views (through the service here) and the fast lane on
the event loop run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from gantry import conf, metrics
from gantry.core import secrets as stack_secrets
from gantry.core import tokens
from gantry.core.errors import (
    AcceptResponseUndeliverable,
    Conflict,
    InvalidRequest,
    InvalidTransition,
    NotFound,
    RunAlreadyTerminal,
    RunNotWaiting,
    RunTerminal,
)
from gantry.core.manifest import normalize_manifest
from gantry.core.models import (
    EXECUTING,
    LANE_HOLDERS,
    NEVER_STARTED,
    RUN_PHASES,
    TERMINAL,
    UNCLAIMED,
    Deployment,
    Priority,
    Run,
    RunEvent,
    Runner,
    RunStatus,
    Stack,
)
from gantry.core.services.transitions import Outcome, State, detail_json, move, move_plan, refusal, resolve_now
from gantry.sql import runs as sql
from gantry.sql.rows import loaded
from gantry.sql.statement import AfterCommit, Plan, drive
from gantry_wire.protocol import CHUNK_SIZE, SEAL_INTERVAL


class Refused:
    """A hot plan's answer when its edge was refused: the state judged, for the caller to explain (or hand over)."""

    __slots__ = ("state",)

    def __init__(self, state: State) -> None:
        self.state = state


def run_assign(*, run_id: uuid.UUID, runner: Runner, now: datetime | None = None) -> Run:
    """pending → assigned to ``runner`` with a lease of ``GANTRY_ASSIGNMENT_TTL``.

    The poll's claim takes this edge together with its run selection; this is
    the same edge for a run picked by id, with the claim's guards on the run:
    pending and bound to no live runner (a lapsed lease keeps its runner
    pointer until that runner is gone: One Runner Per Run). The group's drain
    and capacity are the claim's to judge; a caller here has chosen the runner.
    """
    now = resolve_now(now)
    expires = now + timedelta(seconds=conf.get().assignment_ttl)
    return move(sql.ASSIGN, run_id=run_id, now=now, runner=runner.id, grp=runner.runner_group_id, expires=expires)


def run_reset_lease(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """assigned → pending after the lease lapsed; the lease is cleared, the runner pointer kept.

    Keeping ``assigned_runner_id`` is what stops a second runner being sent
    while the first may still be booting toward /accept (One Runner Per Run).
    """
    return move(sql.RESET_LEASE, run_id=run_id, now=resolve_now(now))


def run_accept(*, run_id: uuid.UUID, runner_id: uuid.UUID, now: datetime | None = None) -> tuple[Run, str]:
    """assigned → running for the runner that holds an unexpired lease; mints the run API token.

    Returns the run and the clear-text API token (the database keeps its hash).
    Refusals follow docs/design.md's "When the accept response never arrives"
    and "When the run is already terminal at accept".
    """
    now = resolve_now(now)
    accepted = drive(accept_plan(run_id=run_id, runner_id=runner_id, group_id=None, now=now))
    if isinstance(accepted, Refused):
        raise _accept_refusal(accepted.state, run_id=run_id, runner_id=runner_id, now=now)
    return accepted


def accept_plan(
    *, run_id: uuid.UUID, runner_id: uuid.UUID, group_id: int | None, now: datetime
) -> Plan[tuple[Run, str] | Refused]:
    """Accept as a plan: the run (its deployment's spec and stack's secrets loaded) and its API token.

    ``group_id``: the token's group, judged by the statement itself (the fast
    lane's; None when the caller checked the runner row already).
    """
    api_token, digest = tokens.new_run_api_token()
    args = sql.one_args(run=run_id, now=now, runner=runner_id, grp=group_id, digest=digest)
    outcome = yield from move_plan(sql.ACCEPT, args)
    run = outcome.run
    if run is None:
        return Refused(outcome.state)
    spec, secrets, group_id = outcome.also
    # As select_related would: run_context reads run.deployment.spec and
    # run.stack.secrets without a query (only those fields are loaded).
    run.deployment = loaded(Deployment, id=run.deployment_id, spec=_json(spec))
    run.stack = loaded(Stack, id=run.stack_id, secrets=_json(secrets))
    if run.assigned_at is not None:
        # The accepted claim's start-up: the claim that led here (assigned_at), not the first one.
        started = (now - run.assigned_at).total_seconds()
        yield AfterCommit(
            lambda: metrics.record_phase(organization_id=run.organization_id, group_id=group_id, start=started)
        )
    return run, api_token


def _json(raw: Any) -> Any:
    # A JSON column arrives as text (Django has psycopg leave it to the field).
    return json.loads(raw) if isinstance(raw, str) else raw


def _accept_refusal(state: State, *, run_id: uuid.UUID, runner_id: uuid.UUID, now: datetime) -> Exception:
    """Why accept refused, from the state its statement judged."""
    status = state.status
    if status is None:
        return NotFound("run not found")
    if status in (RunStatus.DISCARDED, RunStatus.CANCELLED):
        return RunAlreadyTerminal(f"run is already {status}", status=status)
    if status in EXECUTING and state.assigned_runner_id == runner_id:
        # A second accept from the runner that already accepted can only mean
        # the first answer never reached it: the context (and its one-time
        # credentials) is gone, so the run cannot proceed. Fail it now, on
        # evidence, instead of an hour later on silence.
        run_fail(
            run_id=run_id,
            reason="accept response undeliverable: the runner retried /accept for a running run",
            event="accept_response_undeliverable",
            expected=EXECUTING,
            now=now,
        )
        return AcceptResponseUndeliverable(
            "the first accept's answer was not delivered; the run has been failed and may be retried",
            status=RunStatus.FAILURE,
        )
    if status == RunStatus.PENDING:
        return Conflict("run is pending: the assignment lease expired and was reset", status=status)
    if state.assigned_runner_id != runner_id and status not in TERMINAL:
        return Conflict("run was reassigned to another runner", status=status)
    if status == RunStatus.ASSIGNED:
        return Conflict("run is assigned but its lease is past expiry", status=status)
    return Conflict(f"run is {status}", status=status)


def run_context(*, run: Run, api_token: str) -> dict[str, Any]:
    """The RunContext accept answers: everything the runner needs to execute ``run`` (docs/protocol.md).

    ``api_token`` is the run API token :func:`run_accept` minted; it is
    reserved (nothing accepts it yet) and handed out once, never stored.
    """
    cfg = conf.get()
    return {
        "run_id": run.id,
        "deployment_id": run.deployment_id,
        "stack_id": run.stack_id,
        "spec": run.deployment.spec,
        "secrets": stack_secrets.unseal(run.stack.secrets),
        "scm": None,
        "logs": {
            "chunk_size_bytes": CHUNK_SIZE,
            "seal_interval_s": SEAL_INTERVAL,
            "live_interval_s": cfg.live_log_interval,
            "max_bytes": cfg.log_max_bytes,
        },
        "status_interval_s": cfg.status_interval,
        "api_token": api_token,
    }


def run_acknowledge_cancel(
    *, run_id: uuid.UUID, runner_id: uuid.UUID | None = None, now: datetime | None = None
) -> Run:
    """requested_cancellation → cancelling: the runner has seen the request and is stopping.

    Idempotent for the runner: a replay after a lost answer finds the run
    cancelling already and changes nothing.
    """
    outcome = drive(move_plan(sql.ACKNOWLEDGE_CANCEL, sql.one_args(run=run_id, now=resolve_now(now), runner=runner_id)))
    if outcome.run is not None:
        return outcome.run
    state = outcome.state
    if runner_id is not None and state.status == RunStatus.CANCELLING and state.assigned_runner_id == runner_id:
        return Run.objects.get(id=run_id)
    raise refusal(sql.ACKNOWLEDGE_CANCEL, state)


def run_finish(
    *,
    run_id: uuid.UUID,
    outcome: str,
    runner_id: uuid.UUID | None = None,
    now: datetime | None = None,
    **report: Any,
) -> Run:
    """The runner's /done: an executing run ends as succeeded, failure or cancelled.

    ``report`` is the rest of what the runner reports (DoneSerializer's fields:
    ``exit_code``, ``error``, ``sealed_chunks``, ``manifest``), kept on the
    run by the edge's statement. ``manifest`` (``{count, sha256}``) lists the
    run's sealed log chunks for the log reader; it must agree with
    ``sealed_chunks``. A replay of /done whose first answer was lost (same
    runner, outcome, exit code and manifest, already recorded) is accepted as
    it is; anything else that differs stays a conflict: a replay must never
    quietly drop what differs.
    """
    now = resolve_now(now)
    report = {"outcome": outcome, **report}
    done = drive(finish_plan(run_id=run_id, runner_id=runner_id, group_id=None, now=now, report=report))
    if not isinstance(done, Refused):
        return done
    state = done.state
    manifest = report.get("manifest")
    kept = normalize_manifest(manifest, sealed_chunks=report.get("sealed_chunks")) if manifest is not None else None
    ours = runner_id is not None and state.assigned_runner_id == runner_id and state.status == outcome
    if ours and state.exit_code == report.get("exit_code") and (kept is None or state.log_manifest == kept):
        return Run.objects.get(id=run_id)
    if ours:
        raise RunTerminal(
            f"run is {outcome} already, with another exit code or log manifest than this report", status=outcome
        )
    raise refusal(sql.FINISH, state, target=outcome, expected=sql.finish_expected(outcome))


def finish_plan(
    *, run_id: uuid.UUID, runner_id: uuid.UUID | None, group_id: int | None, now: datetime, report: Mapping[str, Any]
) -> Plan[Run | Refused]:
    """/done as a plan: the finished run, or Refused. An invalid outcome or manifest raises before any write.

    ``report``: the outcome and the rest DoneSerializer validated, handed to
    the edge's statement as they are (``gantry.sql.runs.finish_args``). One
    round trip: the lane lock and the whole terminal edge (event, deployment,
    token, the stack's next run promoted).
    """
    outcome = report["outcome"]
    if outcome not in sql.FINISH_OUTCOMES:
        raise InvalidRequest("outcome must be one of: succeeded, failure, cancelled")
    fields = {k: v for k, v in report.items() if k != "outcome"}
    if fields.get("manifest") is not None:
        # Checked before the edge: a refused /done changes nothing.
        fields["manifest"] = normalize_manifest(fields["manifest"], sealed_chunks=fields.get("sealed_chunks"))
        fields["sealed_chunks"] = fields["manifest"]["count"]
    args = sql.one_args(run=run_id, now=now, runner=runner_id, grp=group_id, **sql.finish_args(outcome, fields))
    result: Outcome = yield from move_plan(sql.FINISH, args)
    run = result.run
    if run is None:
        return Refused(result.state)
    first_output = phase_seconds(run.started_at, run.first_output_at)
    if first_output is not None:
        # Observed at the end, from the row FINISH answers: the live push that stamps first_output_at
        # stays one statement (docs/performance.md, "A run's phases").
        (group_id,) = result.also
        yield AfterCommit(
            lambda: metrics.record_phase(
                organization_id=run.organization_id, group_id=group_id, first_output=first_output
            )
        )
    return run


def phase_seconds(start: datetime | None, end: datetime | None) -> float | None:
    """Seconds from ``start`` to ``end``; None until both are known. Never negative: a phase's end
    stamped by another clock (a replica's) a little behind its start reads as 0."""
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def run_timings(run: Run) -> dict[str, float | None]:
    """A run's phases in seconds, each None until known: ``RUN_PHASES`` read on the row."""
    return {name: phase_seconds(getattr(run, a), getattr(run, b)) for name, (a, b) in RUN_PHASES.items()}


def run_fail(
    *,
    run_id: uuid.UUID,
    reason: str,
    event: str = "failed",
    expected: Iterable[str] = LANE_HOLDERS,
    runner_id: uuid.UUID | None = None,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Run:
    """Any live run (of ``expected``; of ``runner_id`` when given) → failure, as ``event``.

    Runner lost or exited, accept undeliverable, force-delete, an operator.
    """
    return move(
        sql.FAIL, run_id=run_id, now=resolve_now(now), expected=frozenset(expected), runner=runner_id,
        reason=reason, event=event, detail=detail_json(detail),
    )  # fmt: skip


def fail_executing_run(
    *,
    run_id: uuid.UUID,
    runner_id: uuid.UUID,
    reason: str,
    event: str,
    now: datetime,
    detail: dict[str, Any] | None = None,
) -> Run:
    """Fail a run its runner was executing, guarded on that runner still holding it."""
    return run_fail(run_id=run_id, reason=reason, event=event, expected=EXECUTING, runner_id=runner_id,
                    detail=detail, now=now)  # fmt: skip


def run_startup_timeout(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """A run that no runner ever started within the startup deadline.

    An assigned run qualifies only once its lease has lapsed: until then its
    runner may be about to accept, and timing the run out under it would race
    that accept. The caller (the startup-deadline reaper) judges the deadline.
    """
    return move(sql.STARTUP_TIMEOUT, run_id=run_id, now=resolve_now(now), deadline=None)


def run_set_priority(
    *, run_id: uuid.UUID, priority: Priority, by: User | None = None, now: datetime | None = None
) -> Run:
    """Change a waiting run's priority (queued, or pending and not claimed): its place in the claim's order.

    Not a status change, so not a Move: the row is locked, judged and written,
    with a ``priority_changed`` event naming both levels. A claim that locked
    the run first has committed by the time our lock returns, and the run then
    reads as assigned: refused (RunNotWaiting), nothing written. Setting the
    priority it already has changes nothing and writes no event.
    """
    now = resolve_now(now)
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True).filter(id=run_id).first()
        if run is None:
            raise NotFound("run not found")
        if run.status not in UNCLAIMED:
            raise RunNotWaiting(
                f"the run is {run.status}: only a queued or pending run's priority can change", status=run.status
            )
        if run.priority != priority:
            before = Priority(run.priority).label
            Run.objects.filter(id=run.id).update(priority=priority, updated_at=now)
            detail = {"from": before, "to": Priority(priority).label}
            if by is not None:
                detail["by"] = by.get_username()
            RunEvent.objects.create(run_id=run.id, at=now, kind="priority_changed", detail=detail)
            run.priority = priority
    return run


def run_request_cancellation(*, run_id: uuid.UUID, by: User | None = None, now: datetime | None = None) -> Run:
    """RequestCancellation.

    A run that never started is cancelled outright (and its lane released); a
    started one moves to requested_cancellation, which its runner sees on
    /status. Asking again while a cancellation is under way changes nothing.
    """
    now = resolve_now(now)
    who = detail_json({"by": by.get_username()} if by is not None else {})
    # Two attempts: the run may move between our read and our guarded write
    # (e.g. accepted in between); the second read sees where it went.
    refused: InvalidTransition | None = None
    for _ in range(2):
        run = Run.objects.filter(id=run_id).first()
        if run is None:
            raise NotFound("run not found")
        try:
            if run.status in NEVER_STARTED:
                return move(sql.CANCEL_UNSTARTED, run_id=run_id, now=now, detail=who)
            if run.status == RunStatus.RUNNING:
                return move(sql.REQUEST_CANCELLATION, run_id=run_id, now=now, detail=who)
            if run.status in (RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING):
                return run
            raise RunTerminal(f"run is {run.status}; a finished run cannot be cancelled", status=run.status)
        except InvalidTransition as exc:
            refused = exc
    assert refused is not None
    raise refused


def run_cancel_backstop(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """requested_cancellation on a run that never started → cancelled, and its lane promoted.

    RequestCancellation no longer creates this state (it cancels a never-started
    run outright), but a run already in it has no runner to acknowledge it,
    matches no other reaper, and holds its stack's lane for ever. Gated on a
    lapsed lease so it never races an /accept still in flight.
    """
    return move(sql.CANCEL_BACKSTOP, run_id=run_id, now=resolve_now(now),
                detail=detail_json(sql.CANCEL_BACKSTOP_DETAIL))  # fmt: skip
