"""A run's life after it is created: assign, lease reset, accept, cancel, finish, fail, time out.

Each function is one edge of the state machine (docs/design.md), built from
``transitions``: guarded, evented, and — when the run ends — promoting its
stack's next run. The poll's claim (``gantry.dispatch.claim``) is the one place
outside these services that moves a run (pending → assigned), in one SQL
statement with the same guards as :func:`run_assign`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import User

from gantry import conf, metrics
from gantry.core import prepared, tokens
from gantry.core import secrets as stack_secrets
from gantry.core.errors import (
    AcceptResponseUndeliverable,
    Conflict,
    InvalidRequest,
    InvalidTransition,
    NotFound,
    RunAlreadyTerminal,
    RunTerminal,
)
from gantry.core.models import (
    EXECUTING,
    LANE_HOLDERS,
    NEVER_STARTED,
    TERMINAL,
    Run,
    Runner,
    RunStatus,
)
from gantry.core.services import bulk, hotpath
from gantry.core.services.transitions import (
    record_finished,
    refusal,
    resolve_now,
    terminate,
    transition,
)
from gantry.logs.limits import CHUNK_SIZE, SEAL_INTERVAL
from gantry.logs.manifest import normalize_manifest


def run_assign(*, run_id: uuid.UUID, runner: Runner, now: datetime | None = None) -> Run:
    """pending → assigned to ``runner`` with a lease of ``GANTRY_ASSIGNMENT_TTL``.

    The poll's claim performs this edge in one SQL statement together with the
    run selection; this is the same edge for a run picked by id, with the
    claim's guards on the run: pending and bound to no live runner (a lapsed
    lease keeps its runner pointer until that runner is gone: One Runner Per
    Run). The group's drain and capacity are the claim's to judge; a caller
    here has chosen the runner itself.
    """
    now = resolve_now(now)
    return transition(
        run_id,
        expected={RunStatus.PENDING},
        target=RunStatus.ASSIGNED,
        now=now,
        event="assigned",
        detail={"runner_id": str(runner.id), "runner_group_id": runner.runner_group_id},
        extra_filter={"assigned_runner__isnull": True},
        guard="no live runner still bound to it (its previous runner must be gone first)",
        assigned_runner_id=runner.id,
        assigned_at=now,
        assigned_expires_at=now + timedelta(seconds=conf.get().assignment_ttl),
    )


def run_reset_lease(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """assigned → pending after the lease lapsed; the lease is cleared, the runner pointer kept.

    Keeping ``assigned_runner_id`` is what stops a second runner being sent
    while the first may still be booting toward /accept (One Runner Per Run).
    """
    now = resolve_now(now)
    # The reaper's set-based transition (gantry.core.services.bulk), for one run.
    if not bulk.reset_leases([run_id], now=now, skip_locked=False):
        raise refusal(run_id, RunStatus.PENDING, {RunStatus.ASSIGNED}, bulk.RESET_LEASE_GUARD)
    return Run.objects.get(id=run_id)


def run_accept(*, run_id: uuid.UUID, runner_id: uuid.UUID, now: datetime | None = None) -> tuple[Run, str]:
    """assigned → running for the runner that holds an unexpired lease; mints the run API token.

    Returns the run and the clear-text API token (the database keeps its hash).
    Refusals follow docs/design.md's "When the accept response never arrives"
    and "When the run is already terminal at accept".
    """
    now = resolve_now(now)
    accepted = accept_hot(run_id=run_id, runner_id=runner_id, runner_group_id=None, now=now)
    if accepted is not None:
        return accepted
    raise _accept_refusal(run_id=run_id, runner_id=runner_id, now=now)


def accept_hot(
    *, run_id: uuid.UUID, runner_id: uuid.UUID, runner_group_id: int | None, now: datetime
) -> tuple[Run, str] | None:
    """Accept's common case alone: the run and its clear-text API token, or None (nothing changed).

    One prepared statement (hotpath): the guarded edge, the token, the busy
    runner, the event and the deployment, with the RunContext's spec and
    secrets read along. None: the guard failed (or the runner is not of
    ``runner_group_id``; None: not checked), and :func:`run_accept` names why.
    """
    return prepared.drive(accept_hot_plan(run_id=run_id, runner_id=runner_id, runner_group_id=runner_group_id, now=now))


def accept_hot_plan(
    *, run_id: uuid.UUID, runner_id: uuid.UUID, runner_group_id: int | None, now: datetime
) -> prepared.Plan[tuple[Run, str] | None]:
    """:func:`accept_hot` as a plan (gantry.core.prepared), for either driver."""
    api_token, digest = tokens.new_run_api_token()
    run = yield from hotpath.accept_plan(run_id=run_id, runner_id=runner_id, group_id=runner_group_id, digest=digest,
                                         now=now)  # fmt: skip
    if run is None:
        return None
    if run.assigned_at is not None:
        started = (now - run.assigned_at).total_seconds()
        # Inside a caller's transaction this waits for its commit; in
        # autocommit the statement has committed and it runs at once.
        yield prepared.AfterCommit(
            lambda: metrics.record_run(organization_id=run.organization_id, timings={"claimed_to_accepted": started})
        )
    return run, api_token


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


def _accept_refusal(*, run_id: uuid.UUID, runner_id: uuid.UUID, now: datetime) -> Exception:
    run = Run.objects.filter(id=run_id).first()
    if run is None:
        return NotFound("run not found")
    if run.status in (RunStatus.DISCARDED, RunStatus.CANCELLED):
        return RunAlreadyTerminal(f"run is already {run.status}", status=run.status)
    if run.status in EXECUTING and run.assigned_runner_id == runner_id:
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
    if run.status == RunStatus.PENDING:
        return Conflict("run is pending: the assignment lease expired and was reset", status=run.status)
    if run.assigned_runner_id != runner_id and run.status not in TERMINAL:
        return Conflict("run was reassigned to another runner", status=run.status)
    if run.status == RunStatus.ASSIGNED:
        return Conflict("run is assigned but its lease is past expiry", status=run.status)
    return Conflict(f"run is {run.status}", status=run.status)


def run_acknowledge_cancel(
    *, run_id: uuid.UUID, runner_id: uuid.UUID | None = None, now: datetime | None = None
) -> Run:
    """requested_cancellation → cancelling: the runner has seen the request and is stopping.

    Idempotent for the runner: a replay after a lost answer finds the run
    cancelling already and changes nothing.
    """
    now = resolve_now(now)
    bound = {"assigned_runner_id": runner_id} if runner_id is not None else {}
    try:
        return transition(
            run_id,
            expected={RunStatus.REQUESTED_CANCELLATION},
            target=RunStatus.CANCELLING,
            now=now,
            event="cancel_acknowledged",
            extra_filter=bound,
            guard="the runner that holds it",
        )
    except InvalidTransition:
        run = Run.objects.get(id=run_id)
        if runner_id is not None and run.status == RunStatus.CANCELLING and run.assigned_runner_id == runner_id:
            return run
        raise


def run_finish(
    *,
    run_id: uuid.UUID,
    outcome: str,
    runner_id: uuid.UUID | None = None,
    exit_code: int | None = None,
    error: str = "",
    sealed_chunks: int | None = None,
    manifest: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Run:
    """The runner's /done: an executing run ends as succeeded, failure or cancelled.

    ``manifest`` (``{count, sha256}``) lists the run's sealed log chunks and is
    kept on the run for the log reader; it must agree with ``sealed_chunks``.
    """
    now = resolve_now(now)
    expected, fields = _finish_terms(outcome, exit_code, error, sealed_chunks, manifest)
    if runner_id is not None:
        # The runner's /done, the common case: the lane lock and the whole
        # terminal transition (event, deployment, token, next run promoted) in
        # one round trip (hotpath). A refused guard changed nothing: the ORM
        # path below tries the same guard again and names the refusal.
        done = prepared.drive(_finish_hot_plan(run_id, runner_id, None, outcome, expected, fields, now))
        if done is not None:
            return done
    bound = {"assigned_runner_id": runner_id} if runner_id is not None else {}
    try:
        return terminate(
            run_id,
            expected=expected,
            target=outcome,
            now=now,
            event="finished",
            detail={"outcome": outcome, "exit_code": exit_code},
            extra_filter=bound,
            guard="the runner that holds it",
            **fields,
        )
    except RunTerminal as exc:
        # A replay of /done whose first answer was lost: same runner, same
        # outcome, same exit code and log manifest, already recorded. Anything
        # else stays a conflict: a replay must never quietly drop what differs.
        run = Run.objects.get(id=run_id)
        same = (
            runner_id is not None
            and run.status == outcome
            and run.assigned_runner_id == runner_id
            and run.exit_code == exit_code
            and ("log_manifest" not in fields or run.log_manifest == fields["log_manifest"])
        )
        if same:
            return run
        if runner_id is not None and run.assigned_runner_id == runner_id and run.status == outcome:
            raise RunTerminal(
                f"run is {run.status} already, with another exit code or log manifest than this report",
                status=run.status,
            ) from exc
        raise


def finish_hot(
    *,
    run_id: uuid.UUID,
    runner_id: uuid.UUID,
    runner_group_id: int | None,
    outcome: str,
    exit_code: int | None = None,
    error: str = "",
    sealed_chunks: int | None = None,
    manifest: Mapping[str, Any] | None = None,
    now: datetime,
) -> Run | None:
    """The runner's /done, common case alone: the finished run, or None (nothing changed).

    An invalid outcome or manifest raises before anything is written, as
    :func:`run_finish` does; None means the guard failed (the run is not this
    runner's executing run, or the runner not of ``runner_group_id``; None:
    not checked), and :func:`run_finish` names why or accepts a replay.
    """
    return prepared.drive(finish_hot_plan(run_id=run_id, runner_id=runner_id, runner_group_id=runner_group_id,
                                          outcome=outcome, exit_code=exit_code, error=error,
                                          sealed_chunks=sealed_chunks, manifest=manifest, now=now))  # fmt: skip


def finish_hot_plan(
    *,
    run_id: uuid.UUID,
    runner_id: uuid.UUID,
    runner_group_id: int | None,
    outcome: str,
    exit_code: int | None = None,
    error: str = "",
    sealed_chunks: int | None = None,
    manifest: Mapping[str, Any] | None = None,
    now: datetime,
) -> prepared.Plan[Run | None]:
    """:func:`finish_hot` as a plan (gantry.core.prepared), for either driver; a refusal raises before any write."""
    expected, fields = _finish_terms(outcome, exit_code, error, sealed_chunks, manifest)
    return (yield from _finish_hot_plan(run_id, runner_id, runner_group_id, outcome, expected, fields, now))


def _finish_terms(
    outcome: str,
    exit_code: int | None,
    error: str,
    sealed_chunks: int | None,
    manifest: Mapping[str, Any] | None,
) -> tuple[frozenset[str], dict[str, Any]]:
    """The statuses /done may end, and the run's fields it writes; a refusal raises (before any write)."""
    expected: frozenset[str]
    if outcome in (RunStatus.SUCCEEDED, RunStatus.FAILURE):
        expected = EXECUTING
    elif outcome == RunStatus.CANCELLED:
        # A runner reports cancelled only when cancellation was asked of it.
        expected = frozenset({RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING})
    else:
        raise InvalidRequest("outcome must be one of: succeeded, failure, cancelled")
    fields: dict[str, Any] = {"exit_code": exit_code, "failure_reason": error}
    if sealed_chunks is not None:
        fields["sealed_chunks"] = sealed_chunks
    if manifest is not None:
        # Checked before the transition: a refused /done changes nothing.
        fields["log_manifest"] = normalize_manifest(manifest, sealed_chunks=sealed_chunks)
        fields["sealed_chunks"] = fields["log_manifest"]["count"]
    return expected, fields


def _finish_hot_plan(
    run_id: uuid.UUID,
    runner_id: uuid.UUID,
    runner_group_id: int | None,
    outcome: str,
    expected: frozenset[str],
    fields: dict[str, Any],
    now: datetime,
) -> prepared.Plan[Run | None]:
    done = yield from hotpath.finish_plan(run_id=run_id, runner_id=runner_id, group_id=runner_group_id,
                                          outcome=outcome, expected=expected, exit_code=fields["exit_code"],
                                          error=fields["failure_reason"], sealed_chunks=fields.get("sealed_chunks"),
                                          manifest=fields.get("log_manifest"), now=now)  # fmt: skip
    if done is not None:
        yield prepared.AfterCommit(partial(record_finished, done))
    return done


def run_fail(
    *,
    run_id: uuid.UUID,
    reason: str,
    event: str = "failed",
    expected: Iterable[str] = frozenset(LANE_HOLDERS),
    extra_filter: dict[str, Any] | None = None,
    guard: str = "",
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Run:
    """Any live run → failure (runner lost or exited, dispatch failed, accept undeliverable, force-delete)."""
    return terminate(
        run_id,
        expected=expected,
        target=RunStatus.FAILURE,
        now=resolve_now(now),
        event=event,
        detail=detail,
        extra_filter=extra_filter,
        guard=guard,
        failure_reason=reason,
    )


def run_startup_timeout(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """A run that no runner ever started within the startup deadline.

    An assigned run qualifies only once its lease has lapsed: until then its
    runner may be about to accept, and timing the run out under it would race
    that accept. The caller (the startup-deadline reaper) judges the deadline.
    """
    now = resolve_now(now)
    # The reaper's set-based transition (gantry.core.services.bulk), for one run.
    if not bulk.startup_timeouts([run_id], now=now, skip_locked=False):
        raise refusal(
            run_id, RunStatus.STARTUP_TIMEOUT, {RunStatus.PENDING, RunStatus.ASSIGNED}, bulk.NEVER_STARTED_GUARD
        )
    return Run.objects.get(id=run_id)


def run_request_cancellation(*, run_id: uuid.UUID, by: User | None = None, now: datetime | None = None) -> Run:
    """RequestCancellation.

    A run that never started is cancelled outright (and its lane released); a
    started one moves to requested_cancellation, which its runner sees on
    /status. Asking again while a cancellation is under way changes nothing.
    """
    now = resolve_now(now)
    who = {"by": by.get_username()} if by is not None else {}
    # Two attempts: the run may move between our read and our guarded write
    # (e.g. accepted in between); the second read sees where it went.
    for _ in range(2):
        run = Run.objects.filter(id=run_id).first()
        if run is None:
            raise NotFound("run not found")
        try:
            if run.status in NEVER_STARTED:
                return terminate(
                    run_id,
                    expected=NEVER_STARTED,
                    target=RunStatus.CANCELLED,
                    now=now,
                    event="cancelled",
                    detail=who,
                    cancel_requested_at=now,
                )
            if run.status == RunStatus.RUNNING:
                return transition(
                    run_id,
                    expected={RunStatus.RUNNING},
                    target=RunStatus.REQUESTED_CANCELLATION,
                    now=now,
                    event="cancel_requested",
                    detail=who,
                    cancel_requested_at=now,
                )
            if run.status in (RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING):
                return run
            raise RunTerminal(f"run is {run.status}; a finished run cannot be cancelled", status=run.status)
        except InvalidTransition:
            continue
    raise refusal(run_id, RunStatus.CANCELLED, NEVER_STARTED | {RunStatus.RUNNING})


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
    return run_fail(
        run_id=run_id,
        reason=reason,
        event=event,
        detail=detail,
        expected=EXECUTING,
        extra_filter={"assigned_runner_id": runner_id},
        guard="the runner that holds it",
        now=now,
    )


def run_cancel_backstop(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """requested_cancellation on a run that never started → cancelled, and its lane promoted.

    RequestCancellation no longer creates this state (it cancels a never-started
    run outright), but a run already in it has no runner to acknowledge it,
    matches no other reaper, and holds its stack's lane for ever. Gated on a
    lapsed lease so it never races an /accept still in flight.
    """
    now = resolve_now(now)
    # The reaper's set-based transition (gantry.core.services.bulk), for one run.
    if not bulk.cancel_backstops([run_id], now=now, skip_locked=False):
        raise refusal(run_id, RunStatus.CANCELLED, {RunStatus.REQUESTED_CANCELLATION}, bulk.NEVER_STARTED_GUARD)
    return Run.objects.get(id=run_id)
