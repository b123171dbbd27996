"""Every write to Gantry's domain goes through a function here (DESIGN §3).

Views, admin actions, reapers and the dispatcher call these; nothing else
changes a run's status. A run transition is one guarded UPDATE
(``WHERE id = … AND status IN (expected)``): anything but one row changed is a
conflict, never a silent overwrite, and each transition writes a ``run_event``.

Lane changes (a run becoming or ceasing to be its stack's lane holder) lock the
stack row first (``FOR NO KEY UPDATE``), always in the order stack → run. That
serialises deployment creation against PromoteNextOnStack, so a run queued
while the lane holder finishes can never be left queued behind no holder. The
partial unique index ``run_one_lane_holder_per_stack`` remains the last word.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Exists, F
from django.db.models.functions import Coalesce
from django.utils import timezone
from rest_framework.authtoken.models import Token

from gantry import conf
from gantry.core import specs, tokens
from gantry.core.errors import Conflict, InvalidRequest, InvalidTransition, NotFound, RunTerminal
from gantry.core.models import (
    DEPLOYMENT_STATUS_FOR_RUN,
    EXECUTING,
    LANE_HOLDERS,
    NEVER_STARTED,
    TERMINAL,
    Deployment,
    Membership,
    Organization,
    Role,
    Run,
    RunEvent,
    Runner,
    RunnerGroup,
    RunnerStatus,
    RunSelector,
    RunStatus,
    RunToken,
    Stack,
)
from gantry.logs.manifest import normalize_manifest

NOTIFY_CHANNEL = "gantry_claimable"


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


# --------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------


def notify_claimable(*, organization_id: int) -> None:
    """Tell parked long polls of this org that a claim may now succeed.

    A *run* becoming claimable notifies by itself (triggers on run and runner,
    migration 0004); this is for the other changes that can make a claim
    succeed: a group undrained or relabelled, a new default group, a new rate.
    NOTIFY is transactional: it is delivered on commit and dropped on rollback,
    so a listener never wakes for a run it cannot see yet.
    """
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, str(organization_id)])


def _lock_stack(stack_id: int) -> None:
    # NO KEY UPDATE: serialises lane changes among themselves without blocking
    # the KEY SHARE lock that inserting a run (FK to stack) takes.
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM stack WHERE id = %s FOR NO KEY UPDATE", [stack_id])
        if cur.fetchone() is None:
            raise NotFound("stack not found")


def _event(run_id: uuid.UUID, kind: str, now: datetime, /, **detail: Any) -> None:
    RunEvent.objects.create(run_id=run_id, kind=kind, at=now, detail=detail)


def _sync_deployment(run: Run, now: datetime) -> None:
    """A deployment's status follows its newest run."""
    newer = Run.objects.filter(deployment_id=run.deployment_id, attempt__gt=run.attempt)
    Deployment.objects.filter(id=run.deployment_id).exclude(status=DEPLOYMENT_STATUS_FOR_RUN[run.status]).filter(
        ~Exists(newer)
    ).update(status=DEPLOYMENT_STATUS_FOR_RUN[run.status], updated_at=now)


def _refusal(run_id: uuid.UUID, target: str, expected: Iterable[str], guard: str = "") -> Exception:
    current = Run.objects.filter(id=run_id).values_list("status", flat=True).first()
    if current is None:
        return NotFound("run not found")
    if current in TERMINAL:
        return RunTerminal(f"run is {current}; a finished run never changes", status=current)
    if guard and current in expected:
        # Right state, but the transition's extra condition failed: name the
        # condition. ("run is assigned; pending needs it to be one of: assigned"
        # contradicted itself for a lease that had not lapsed yet.)
        return InvalidTransition(f"run is {current}, but {target} needs {guard}", status=current)
    wanted = ", ".join(sorted(expected))
    return InvalidTransition(f"run is {current}; {target} needs it to be one of: {wanted}", status=current)


def _transition(
    run_id: uuid.UUID,
    *,
    expected: Iterable[str],
    target: str,
    now: datetime,
    event: str,
    detail: dict[str, Any] | None = None,
    extra_filter: dict[str, Any] | None = None,
    guard: str = "",
    **fields: Any,
) -> Run:
    """The guarded update every run transition is made of.

    ``guard`` describes ``extra_filter`` in words, for the refusal when the run
    is in an expected state but the extra condition does not hold.
    """
    expected = frozenset(expected)
    changed = (
        Run.objects.filter(id=run_id, status__in=sorted(expected), **(extra_filter or {}))
        .update(status=target, updated_at=now, **fields)
    )  # fmt: skip
    if changed != 1:
        raise _refusal(run_id, target, expected, guard)
    _event(run_id, event, now, **(detail or {}))
    run = Run.objects.get(id=run_id)
    _sync_deployment(run, now)
    return run


def selector_id_for(*, organization_id: int, selector: dict[str, Any]) -> int:
    """The id of this org's row for ``selector``, created on first use."""
    existing = RunSelector.objects.filter(organization_id=organization_id, selector=selector).first()
    if existing is not None:
        return existing.id
    # ON CONFLICT: two deployments with a new selector may race to create it.
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO run_selector (organization_id, selector) VALUES (%s, %s::jsonb) "
            "ON CONFLICT (organization_id, selector) DO NOTHING",
            [organization_id, _json(selector)],
        )
    return RunSelector.objects.get(organization_id=organization_id, selector=selector).id


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --------------------------------------------------------------------------
# Lanes: creating runs and promoting the queue
# --------------------------------------------------------------------------


def _run_create(
    *, deployment: Deployment, stack: Stack, attempt: int, now: datetime, detail: dict[str, Any] | None = None
) -> Run:
    """Create a run on the stack's lane (caller holds the stack lock).

    ``detail`` adds to the one ``created`` event (a retry names the attempt it repeats).
    """
    lane_taken = Run.objects.filter(stack_id=stack.id, status__in=sorted(LANE_HOLDERS)).exists()
    selector = stack.runner_selector
    run = Run.objects.create(
        organization_id=stack.organization_id,
        stack=stack,
        deployment=deployment,
        attempt=attempt,
        status=RunStatus.QUEUED if lane_taken else RunStatus.PENDING,
        runner_selector=selector,
        selector_id=selector_id_for(organization_id=stack.organization_id, selector=selector),
        first_pending_at=None if lane_taken else now,
        created_at=now,
        updated_at=now,
    )
    _event(run.id, "created", now, status=run.status, attempt=attempt, **(detail or {}))
    _sync_deployment(run, now)
    return run


def deployment_create(
    *,
    stack: Stack,
    spec: dict[str, Any] | None = None,
    created_by: User | None = None,
    now: datetime | None = None,
) -> Deployment:
    """Queue a deployment: its run is pending when the stack's lane is free, else queued."""
    now = _now(now)
    if spec is None:
        if not stack.spec:
            raise InvalidRequest("the stack has no default spec; pass one")
        spec = stack.spec
    clean = specs.validate_spec(spec)
    with transaction.atomic():
        _lock_stack(stack.id)
        deployment = Deployment.objects.create(
            stack=stack, spec=clean, created_by=created_by, created_at=now, updated_at=now
        )
        _run_create(deployment=deployment, stack=stack, attempt=1, now=now)
    deployment.refresh_from_db()
    return deployment


def stack_promote_next(*, stack_id: int, now: datetime | None = None) -> Run | None:
    """PromoteNextOnStack: when the lane is free, its oldest queued run becomes pending.

    Called inside the transaction that freed the lane, with the stack locked.
    ``first_pending_at`` is stamped the first time only: the startup deadline
    counts from a run's original eligibility.
    """
    now = _now(now)
    if Run.objects.filter(stack_id=stack_id, status__in=sorted(LANE_HOLDERS)).exists():
        return None
    nxt = Run.objects.filter(stack_id=stack_id, status=RunStatus.QUEUED).order_by("created_at", "id").first()
    if nxt is None:
        return None
    run = _transition(
        nxt.id,
        expected={RunStatus.QUEUED},
        target=RunStatus.PENDING,
        now=now,
        event="promoted",
        first_pending_at=Coalesce(F("first_pending_at"), now),
    )
    return run


def _terminate(
    run_id: uuid.UUID,
    *,
    expected: Iterable[str],
    target: str,
    now: datetime,
    event: str,
    detail: dict[str, Any] | None = None,
    extra_filter: dict[str, Any] | None = None,
    guard: str = "",
    **fields: Any,
) -> Run:
    """Move a run to a terminal state, revoke its token and promote its stack's queue."""
    assert target in TERMINAL
    stack_id = Run.objects.filter(id=run_id).values_list("stack_id", flat=True).first()
    if stack_id is None:
        raise NotFound("run not found")
    with transaction.atomic():
        _lock_stack(stack_id)
        run = _transition(
            run_id,
            expected=expected,
            target=target,
            now=now,
            event=event,
            detail=detail,
            extra_filter=extra_filter,
            guard=guard,
            finished_at=now,
            assigned_at=None,
            assigned_expires_at=None,
            **fields,
        )
        RunToken.objects.filter(run_id=run_id, revoked_at__isnull=True).update(revoked_at=now)
        stack_promote_next(stack_id=stack_id, now=now)
    return run


# --------------------------------------------------------------------------
# The run's life
# --------------------------------------------------------------------------


def run_assign(*, run_id: uuid.UUID, runner: Runner, now: datetime | None = None) -> Run:
    """pending → assigned to ``runner`` with a lease of ``GANTRY_ASSIGNMENT_TTL``.

    The poll's claim performs this edge in one SQL statement together with the
    run selection; this is the same edge for a run picked by id.
    """
    now = _now(now)
    return _transition(
        run_id,
        expected={RunStatus.PENDING},
        target=RunStatus.ASSIGNED,
        now=now,
        event="assigned",
        detail={"runner_id": str(runner.id), "runner_group_id": runner.runner_group_id},
        assigned_runner_id=runner.id,
        assigned_at=now,
        assigned_expires_at=now + timedelta(seconds=conf.get().assignment_ttl),
    )


def run_reset_lease(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """assigned → pending after the lease lapsed; the lease is cleared, the runner pointer kept.

    Keeping ``assigned_runner_id`` is what stops a second runner being sent
    while the first may still be booting toward /accept (One Runner Per Run).
    """
    now = _now(now)
    with transaction.atomic():
        return _transition(
            run_id,
            expected={RunStatus.ASSIGNED},
            target=RunStatus.PENDING,
            now=now,
            event="lease_expired",
            extra_filter={"assigned_expires_at__lt": now},
            guard="its assignment lease to have lapsed",
            assigned_at=None,
            assigned_expires_at=None,
        )


def run_accept(*, run_id: uuid.UUID, runner_id: uuid.UUID, now: datetime | None = None) -> tuple[Run, str]:
    """assigned → running for the runner that holds an unexpired lease; mints the run API token.

    Returns the run and the clear-text API token (the database keeps its hash).
    Refusals follow the reference's "When the accept response never arrives"
    and "When the run is already terminal at accept".
    """
    now = _now(now)
    api_token, digest = tokens.new_run_api_token()
    with transaction.atomic():
        changed = Run.objects.filter(
            id=run_id, status=RunStatus.ASSIGNED, assigned_runner_id=runner_id, assigned_expires_at__gt=now
        ).update(status=RunStatus.RUNNING, started_at=now, updated_at=now)
        if changed == 1:
            RunToken.objects.create(run_id=run_id, token_sha256=digest, created_at=now)
            Runner.objects.filter(id=runner_id).update(status=RunnerStatus.BUSY, accepted_at=now, last_seen_at=now)
            _event(run_id, "accepted", now, runner_id=str(runner_id))
            run = Run.objects.get(id=run_id)
            _sync_deployment(run, now)
            return run, api_token
    raise _accept_refusal(run_id=run_id, runner_id=runner_id, now=now)


def _accept_refusal(*, run_id: uuid.UUID, runner_id: uuid.UUID, now: datetime) -> Exception:
    run = Run.objects.filter(id=run_id).first()
    if run is None:
        return NotFound("run not found")
    if run.status in (RunStatus.DISCARDED, RunStatus.CANCELLED):
        err = Conflict(f"run is already {run.status}", code="run_already_terminal", status=run.status)
        err.log_level = logging.INFO
        return err
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
        return Conflict(
            "the first accept's answer was not delivered; the run has been failed and may be retried",
            code="accept_response_undeliverable",
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
    now = _now(now)
    bound = {"assigned_runner_id": runner_id} if runner_id is not None else {}
    try:
        return _transition(
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
    now = _now(now)
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
    bound = {"assigned_runner_id": runner_id} if runner_id is not None else {}
    try:
        return _terminate(
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
    except RunTerminal:
        # A replay of /done whose first answer was lost: same runner, same
        # outcome, already recorded. Anything else stays a conflict.
        run = Run.objects.get(id=run_id)
        if runner_id is not None and run.status == outcome and run.assigned_runner_id == runner_id:
            return run
        raise


def run_fail(
    *,
    run_id: uuid.UUID,
    reason: str,
    event: str = "failed",
    expected: Iterable[str] = frozenset(LANE_HOLDERS),
    extra_filter: dict[str, Any] | None = None,
    guard: str = "",
    now: datetime | None = None,
) -> Run:
    """Any live run → failure (runner lost, dispatch failed, accept undeliverable, force-delete)."""
    return _terminate(
        run_id,
        expected=expected,
        target=RunStatus.FAILURE,
        now=_now(now),
        event=event,
        extra_filter=extra_filter,
        guard=guard,
        failure_reason=reason,
    )


def _lease_lapsed(run_id: uuid.UUID, now: datetime) -> dict[str, Any]:
    """The guard "no runner can still accept this run", as filter arguments for a guarded UPDATE.

    A lease has lapsed when there is none (pending runs never carry one) or it is
    past expiry. Filter arguments cannot say OR, so the run's current lease picks
    the form; if the lease changes between this read and the UPDATE (the run was
    claimed meanwhile), the UPDATE matches nothing and the transition is refused.
    """
    expires = Run.objects.filter(id=run_id).values_list("assigned_expires_at", flat=True).first()
    return {"assigned_expires_at__isnull": True} if expires is None else {"assigned_expires_at__lt": now}


def _fail_executing_run(*, run_id: uuid.UUID, runner_id: uuid.UUID, reason: str, event: str, now: datetime) -> Run:
    """Fail a run its runner was executing, guarded on that runner still holding it."""
    return run_fail(
        run_id=run_id,
        reason=reason,
        event=event,
        expected=EXECUTING,
        extra_filter={"assigned_runner_id": runner_id},
        guard="the runner that holds it",
        now=now,
    )


def run_startup_timeout(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """A run that no runner ever started within the startup deadline.

    An assigned run qualifies only once its lease has lapsed: until then its
    runner may be about to accept, and timing the run out under it would race
    that accept. The caller (the startup-deadline reaper) judges the deadline.
    """
    now = _now(now)
    return _terminate(
        run_id,
        expected={RunStatus.PENDING, RunStatus.ASSIGNED},
        target=RunStatus.STARTUP_TIMEOUT,
        now=now,
        event="startup_timeout",
        extra_filter={"started_at__isnull": True, **_lease_lapsed(run_id, now)},
        guard="a never-started run whose assignment lease has lapsed",
        failure_reason="no runner started the run before the startup deadline",
    )


def run_request_cancellation(*, run_id: uuid.UUID, by: User | None = None, now: datetime | None = None) -> Run:
    """RequestCancellation.

    A run that never started is cancelled outright (and its lane released); a
    started one moves to requested_cancellation, which its runner sees on
    /status. Asking again while a cancellation is under way changes nothing.
    """
    now = _now(now)
    who = {"by": by.get_username()} if by is not None else {}
    # Two attempts: the run may move between our read and our guarded write
    # (e.g. accepted in between); the second read sees where it went.
    for _ in range(2):
        run = Run.objects.filter(id=run_id).first()
        if run is None:
            raise NotFound("run not found")
        try:
            if run.status in NEVER_STARTED:
                return _terminate(
                    run_id,
                    expected=NEVER_STARTED,
                    target=RunStatus.CANCELLED,
                    now=now,
                    event="cancelled",
                    detail=who,
                    cancel_requested_at=now,
                )
            if run.status == RunStatus.RUNNING:
                return _transition(
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
    raise _refusal(run_id, RunStatus.CANCELLED, NEVER_STARTED | {RunStatus.RUNNING})


def _newest_run(deployment_id: int) -> Run:
    run = Run.objects.filter(deployment_id=deployment_id).order_by("-attempt").first()
    if run is None:
        raise NotFound("deployment not found")
    return run


def deployment_skip(*, deployment_id: int, by: User | None = None, now: datetime | None = None) -> Deployment:
    """Skip a deployment whose run never started: the run is discarded, its lane released."""
    now = _now(now)
    run = _newest_run(deployment_id)
    if run.status not in NEVER_STARTED:
        raise Conflict(f"only a deployment that has not started can be skipped; its run is {run.status}",
                       code="not_skippable", status=run.status)  # fmt: skip
    detail = {"by": by.get_username()} if by is not None else {}
    try:
        _terminate(run.id, expected=NEVER_STARTED, target=RunStatus.DISCARDED, now=now, event="skipped", detail=detail)
    except InvalidTransition as exc:
        raise Conflict(exc.detail, code="not_skippable", **exc.extra) from exc
    return Deployment.objects.get(id=deployment_id)


RETRYABLE = frozenset({RunStatus.FAILURE, RunStatus.STARTUP_TIMEOUT, RunStatus.CANCELLED})


def deployment_retry(*, deployment_id: int, by: User | None = None, now: datetime | None = None) -> Deployment:
    """A new attempt of a failed, timed-out or cancelled deployment; it queues on the stack's lane."""
    now = _now(now)
    deployment = Deployment.objects.select_related("stack").filter(id=deployment_id).first()
    if deployment is None:
        raise NotFound("deployment not found")
    with transaction.atomic():
        _lock_stack(deployment.stack_id)
        # Read under the stack lock: two retries of one deployment serialise here.
        run = _newest_run(deployment_id)
        if run.status not in RETRYABLE:
            raise Conflict(
                f"only a failed, timed-out or cancelled deployment can be retried; its run is {run.status}",
                code="not_retryable",
                status=run.status,
            )
        # One transition, one event: the retry's origin goes into its "created" event
        # (it used to be a second, separate "retry_of" event on the same run).
        retry_detail = {"retry_of": str(run.id), **({"by": by.get_username()} if by else {})}
        _run_create(
            deployment=deployment, stack=deployment.stack, attempt=run.attempt + 1, now=now, detail=retry_detail
        )
    deployment.refresh_from_db()
    return deployment


# --------------------------------------------------------------------------
# Runners
# --------------------------------------------------------------------------

RUNNER_METADATA = ("hostname", "launcher", "pid", "container_id", "pod_name", "workflow_run_id")


def runner_ready(*, runner_id: uuid.UUID, metadata: dict[str, Any] | None = None, now: datetime | None = None) -> None:
    """not_ready → ready, recording where the runner runs.

    Idempotent on ready: the answer is an empty 204, so a lost answer looks to
    the runner like a request that never committed, and it retries. A strict
    edge would fail every replay and strand the runner before it could
    deregister. A busy runner has accepted: it is not replaying, so that is a
    conflict.
    """
    now = _now(now)
    extra = {k: v for k, v in (metadata or {}).items() if k in RUNNER_METADATA and v is not None}
    changed = Runner.objects.filter(id=runner_id, status=RunnerStatus.NOT_READY).update(
        status=RunnerStatus.READY, ready_at=now, **extra
    )
    if changed:
        return
    current = Runner.objects.filter(id=runner_id).values_list("status", flat=True).first()
    if current is None:
        raise NotFound("runner not found")
    if current == RunnerStatus.BUSY:
        raise Conflict("runner has already accepted its run", code="runner_busy")
    if extra:
        Runner.objects.filter(id=runner_id).update(**extra)


def runner_seen(*, runner_id: uuid.UUID, run_id: uuid.UUID, now: datetime | None = None) -> str:
    """The runner's /status: refresh its liveness and answer its run's status (one statement)."""
    now = _now(now)
    with connection.cursor() as cur:
        cur.execute(
            "WITH seen AS (UPDATE runner SET last_seen_at = %s WHERE id = %s) SELECT status FROM run WHERE id = %s",
            [now, runner_id, run_id],
        )
        row = cur.fetchone()
    if row is None:
        raise NotFound("run not found")
    return str(row[0])


def runner_deregister(*, runner_id: uuid.UUID, now: datetime | None = None) -> None:
    """Delete the runner row, unless it still holds a run.

    It holds a run while executing it, or while assigned with an unexpired
    lease (it could still accept). A runner whose run was skipped or whose lease
    lapsed can always go: that frees its group slot and, through the FK's ON
    DELETE SET NULL, releases its run for dispatch at once.
    """
    now = _now(now)
    with connection.cursor() as cur:
        # One statement: the NOT EXISTS and the DELETE see the same snapshot,
        # and the run row lock taken by a concurrent accept makes that accept
        # commit first or see the runner gone.
        cur.execute(
            """
            DELETE FROM runner WHERE id = %(runner)s AND NOT EXISTS (
                SELECT 1 FROM run WHERE assigned_runner_id = %(runner)s
                  AND (status = ANY(%(executing)s) OR (status = 'assigned' AND assigned_expires_at > %(now)s))
            )
            RETURNING id
            """,
            {"runner": runner_id, "executing": sorted(EXECUTING), "now": now},
        )
        if cur.fetchone() is not None:
            return
    if not Runner.objects.filter(id=runner_id).exists():
        raise NotFound("runner not found")
    raise Conflict("runner still holds a run; finish it (or let its lease lapse) first", code="runner_holds_run")


def dispatch_failed(
    *, group: RunnerGroup, run_id: uuid.UUID, runner_id: uuid.UUID, error: str, now: datetime | None = None
) -> Run:
    """The group could not start the runner for a run it claimed (ReportDispatchFailure).

    The run fails rather than re-queues: the group knows the launch failed, and
    dispatching it again would fail again in a loop. The stub is deleted and
    the error recorded on the group for operators.
    """
    now = _now(now)
    if not Runner.objects.filter(id=runner_id, runner_group=group).exists():
        raise NotFound("runner not found in this group")
    with transaction.atomic():
        run = run_fail(
            run_id=run_id,
            reason=f"dispatch failed: {error}",
            event="dispatch_failed",
            # A lapsed lease returns the run to pending but keeps the runner pointer.
            expected={RunStatus.ASSIGNED, RunStatus.PENDING},
            extra_filter={"assigned_runner_id": runner_id, "started_at__isnull": True},
            guard="a never-started run assigned to that runner",
            now=now,
        )
        Runner.objects.filter(id=runner_id).delete()
        RunnerGroup.objects.filter(id=group.id).update(last_dispatch_error=error[:4000], last_dispatch_error_at=now)
    return run


# --------------------------------------------------------------------------
# Reaping and force-delete
# --------------------------------------------------------------------------
#
# The failure-window reapers (gantry/reapers) select due rows and call these;
# each is guarded, so a second sweep racing the first (or a request racing a
# sweep) changes nothing and is refused instead.

# The stub reaper's statement, one batch at a time. A stub (never accepted)
# past the cutoff can no longer accept: its claim's lease started when the
# stub was created, and GANTRY_STUB_CUTOFF is longer than the lease
# (conf.check). The NOT EXISTS is deregister's "still holds a run" test, so a
# stub is kept whatever the settings while it could still accept, or while a
# never-started run stuck in requested_cancellation points at it (the
# cancellation backstop frees that run first). The ON DELETE SET NULL foreign
# key releases each deleted stub's run for dispatch, and the runner trigger
# NOTIFYs its org (migration 0004).
#
# The candidates are taken first, oldest first, straight off
# runner_stub_created_idx, and only then tested: written as one filtered
# SELECT … LIMIT, the planner reads every due stub (or every runner) to sort
# them before the LIMIT, so a sweep would cost its due stubs squared. The
# answer lists every candidate, deleted or kept, so the caller pages on by
# (created_at, id) past kept ones.
_DELETE_STUBS_SQL = """
WITH candidate AS MATERIALIZED (
    SELECT id, created_at FROM runner
    WHERE status IN ('not_ready', 'ready') AND accepted_at IS NULL AND created_at < %(created_before)s
      AND (created_at, id) > (%(after_key)s, %(after_id)s)
    ORDER BY created_at, id
    LIMIT %(limit)s
    -- A stub some request is changing right now (ready, deregister) is left
    -- for the next sweep rather than waited on.
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM runner r USING candidate c
    WHERE r.id = c.id AND NOT EXISTS (
        SELECT 1 FROM run
        WHERE run.assigned_runner_id = r.id
          AND run.status IN ('assigned', 'cancelling', 'requested_cancellation', 'running')
          AND (run.status <> 'assigned' OR run.assigned_expires_at > %(now)s)
    )
    RETURNING r.id
)
SELECT c.created_at, c.id, d.id IS NOT NULL FROM candidate c LEFT JOIN deleted d ON d.id = c.id
ORDER BY c.created_at, c.id
"""


class StubBatch(NamedTuple):
    deleted: list[uuid.UUID]
    # How many stubs the batch examined, and the (created_at, id) of the last: where the next batch starts.
    examined: int
    last: tuple[datetime, uuid.UUID] | None


def runner_delete_stubs(
    *, created_before: datetime, now: datetime, limit: int, after: tuple[datetime, uuid.UUID]
) -> StubBatch:
    """DeleteInactive for stubs: delete never-accepted runners created before ``created_before``.

    One batch: up to ``limit`` stubs, oldest first, after the (created_at, id)
    ``after``. Stubs are not_ready, or ready and never accepted; neither
    heartbeats, so they age from ``created_at``.
    """
    params: dict[str, Any] = {
        "created_before": created_before,
        "now": now,
        "limit": limit,
        "after_key": after[0],
        "after_id": after[1],
    }
    with connection.cursor() as cur:
        cur.execute(_DELETE_STUBS_SQL, params)
        rows = cur.fetchall()
    return StubBatch(
        deleted=[row[1] for row in rows if row[2]],
        examined=len(rows),
        last=(rows[-1][0], rows[-1][1]) if rows else None,
    )


class LostRunner(NamedTuple):
    # The run the runner accepted (to flush its live log), failed now or finished before; None if it has none.
    run_id: uuid.UUID | None
    # Whether this call failed that run as runner lost.
    failed: bool


def runner_fail_lost(
    *, runner_id: uuid.UUID, silent_before: datetime, now: datetime | None = None
) -> LostRunner | None:
    """DeleteInactive for a busy runner silent since before ``silent_before``: fail its run as runner lost.

    Answers None when the runner is not (or no longer) a silent busy runner: it
    checked in since the sweep selected it, is gone, or another sweep holds it.
    The runner row is left in place: the caller flushes the run's live log,
    then deletes the row (``runner_deregister``), so a crash in between leaves
    a busy, silent runner whose finished run the next sweep flushes and deletes.
    """
    now = _now(now)
    with transaction.atomic():
        # Locked, then re-checked: a /status that refreshed last_seen_at after the
        # sweep's selection proves the runner alive; one arriving now waits for
        # this transaction and then reads its run's new status (failure).
        # SKIP LOCKED: a runner another sweep is reaping is that sweep's.
        runner = (
            Runner.objects.select_for_update(skip_locked=True).filter(id=runner_id, status=RunnerStatus.BUSY).first()
        )
        if runner is None:
            return None
        seen = runner.last_seen_at or runner.accepted_at or runner.created_at
        if seen >= silent_before:
            return None
        # The run it accepted; a runner accepts one run in its life.
        held = (
            Run.objects.filter(assigned_runner_id=runner_id, started_at__isnull=False)
            .order_by("-started_at")
            .values_list("id", "status")
            .first()
        )
        if held is None:
            return LostRunner(run_id=None, failed=False)
        run_id, status = held
        if status not in EXECUTING:
            return LostRunner(run_id=run_id, failed=False)  # finished, but the runner never deregistered
        _fail_executing_run(
            run_id=run_id,
            runner_id=runner_id,
            reason=f"runner lost: runner {runner_id} has not polled its run's status since {seen.isoformat()}",
            event="runner_lost",
            now=now,
        )
    return LostRunner(run_id=run_id, failed=True)


def run_cancel_backstop(*, run_id: uuid.UUID, now: datetime | None = None) -> Run:
    """requested_cancellation on a run that never started → cancelled, and its lane promoted.

    RequestCancellation no longer creates this state (it cancels a never-started
    run outright), but a run already in it has no runner to acknowledge it,
    matches no other reaper, and holds its stack's lane for ever. Gated on a
    lapsed lease so it never races an /accept still in flight.
    """
    now = _now(now)
    return _terminate(
        run_id,
        expected={RunStatus.REQUESTED_CANCELLATION},
        target=RunStatus.CANCELLED,
        now=now,
        event="cancel_backstop",
        detail={"reason": "cancellation was requested before the run started; no runner will acknowledge it"},
        extra_filter={"started_at__isnull": True, **_lease_lapsed(run_id, now)},
        guard="a never-started run whose assignment lease has lapsed",
    )


def runner_force_delete(
    *, runner_id: uuid.UUID, by: User | None = None, now: datetime | None = None
) -> uuid.UUID | None:
    """Delete a runner an operator knows is gone (ForceDeleteRunner); answers the id of the run it failed, if any.

    Allowed once the runner has been offline past ``GANTRY_RUNNER_FORCE_GATE``:
    last seen (or, never seen, created) that long ago. The run it was executing
    fails as ``force_deleted`` and its stack's queue moves on at once, instead
    of after ``GANTRY_RUNNER_EXECUTION_TIMEOUT``. A run it was only assigned
    (never started) is not failed: deleting the row releases it for dispatch
    (at once if pending; when its lease lapses if still assigned).
    """
    now = _now(now)
    gate = timedelta(seconds=conf.get().runner_force_gate)
    failed: uuid.UUID | None = None
    with transaction.atomic():
        # Locked: a /status arriving now waits, then finds the row gone and its run failed.
        runner = Runner.objects.select_for_update().filter(id=runner_id).first()
        if runner is None:
            raise NotFound("runner not found")
        seen = runner.last_seen_at or runner.created_at
        eligible_at = seen + gate
        if now < eligible_at:
            what = "last seen" if runner.last_seen_at else "created (never seen)"
            raise Conflict(
                f"runner was {what} at {seen.isoformat()}; it may be force-deleted once it has been offline for "
                f"{gate.total_seconds():.0f} s (GANTRY_RUNNER_FORCE_GATE), from {eligible_at.isoformat()}",
                code="runner_not_offline",
                eligible_at=eligible_at.isoformat(),
            )
        failed = (
            Run.objects.filter(assigned_runner_id=runner_id, status__in=sorted(EXECUTING))
            .values_list("id", flat=True)
            .first()
        )
        if failed is not None:
            who = f" by {by.get_username()}" if by is not None else ""
            _fail_executing_run(
                run_id=failed,
                runner_id=runner_id,
                reason=f"runner {runner_id} was force-deleted{who} after being offline since {seen.isoformat()}",
                event="force_deleted",
                now=now,
            )
        # The foreign key's SET NULL releases any run still pointing here. An
        # accept locks run then runner, the reverse of this; it cannot be in
        # flight for a runner offline past the gate while the gate is at least
        # the lease (the defaults), and PostgreSQL's deadlock check settles the rest.
        Runner.objects.filter(id=runner_id).delete()
    return failed


# --------------------------------------------------------------------------
# Organizations, members, groups, stacks
# --------------------------------------------------------------------------


def org_create(*, slug: str, name: str) -> Organization:
    if Organization.objects.filter(slug=slug).exists():
        raise Conflict(f"an organization with slug {slug!r} exists", code="slug_taken")
    return Organization.objects.create(slug=slug, name=name)


def org_update(
    *, org: Organization, name: str | None = None, default_runner_group_id: int | object | None = ...
) -> Organization:
    fields = []
    if name is not None:
        org.name = name
        fields.append("name")
    if default_runner_group_id is not ...:
        if (
            default_runner_group_id is not None
            and not RunnerGroup.objects.filter(
                id=default_runner_group_id,  # type: ignore[misc]
                organization=org,
            ).exists()
        ):
            raise InvalidRequest("default_runner_group_id must name a runner group of this organization")
        org.default_runner_group_id = default_runner_group_id  # type: ignore[assignment]
        fields.append("default_runner_group")
    if fields:
        org.save(update_fields=fields)
        if "default_runner_group" in fields:
            # Empty-selector runs may have become claimable by another group.
            notify_claimable(organization_id=org.id)
    return org


def org_set_runs_per_hour_limit(*, org: Organization, limit: int) -> Organization:
    """Set the org's dispatch rate and drop its deferral stamp in the same write.

    The stamp encodes the refill at the old rate; left in place it would keep
    excluding the org from dispatch after the rate was raised.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidRequest("runs_per_hour_limit must be a whole number, 0 or more")
    Organization.objects.filter(id=org.id).update(runs_per_hour_limit=limit, dispatch_throttled_until=None)
    org.refresh_from_db()
    notify_claimable(organization_id=org.id)
    return org


def membership_set(*, org: Organization, username: str, role: str) -> tuple[Membership, bool, str | None]:
    """Add ``username`` (created if new) to ``org`` with ``role``, or change its role.

    Returns the membership, whether it is new, and an API token when the user
    was created here (so the caller can hand it over once).
    """
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of: {', '.join(Role.values)}")
    if not isinstance(username, str) or not username.strip() or len(username) > 150:
        raise InvalidRequest("username must be a non-empty string of at most 150 characters")
    User = get_user_model()
    with transaction.atomic():
        user, user_created = User.objects.get_or_create(username=username)
        if user_created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        membership, created = Membership.objects.get_or_create(user=user, organization=org, defaults={"role": role})
        if not created and membership.role != role:
            membership.role = role
            membership.save(update_fields=["role"])
        if role == Role.ADMIN and not user.is_staff:
            # Org admins work in the Django admin too (scoped to their orgs).
            user.is_staff = True
            user.save(update_fields=["is_staff"])
        api_token = Token.objects.create(user=user).key if user_created else None
    return membership, created, api_token


def runner_group_create(*, org: Organization, name: str, **fields: Any) -> tuple[RunnerGroup, str]:
    """Create a group; returns it with its token (shown once, never stored)."""
    if "labels" in fields:
        fields["labels"] = specs.validate_group_labels(fields["labels"])
    if RunnerGroup.objects.filter(organization=org, name=name).exists():
        raise Conflict(f"a runner group named {name!r} exists in this organization", code="name_taken")
    group = RunnerGroup.objects.create(organization=org, name=name, **fields)
    return group, tokens.mint_group_token(group_id=group.id, token_version=group.token_version)


def runner_group_update(*, group: RunnerGroup, **fields: Any) -> RunnerGroup:
    if "labels" in fields:
        fields["labels"] = specs.validate_group_labels(fields["labels"])
    if (
        "name" in fields
        and RunnerGroup.objects.filter(organization_id=group.organization_id, name=fields["name"])
        .exclude(id=group.id)
        .exists()
    ):
        raise Conflict(f"a runner group named {fields['name']!r} exists in this organization", code="name_taken")
    for key, value in fields.items():
        setattr(group, key, value)
    if fields:
        group.save(update_fields=list(fields))
        # New labels or capacity can make waiting runs claimable.
        notify_claimable(organization_id=group.organization_id)
    return group


def runner_group_rotate_token(*, group: RunnerGroup) -> str:
    """Issue a new group token; every token issued before stops working at once."""
    RunnerGroup.objects.filter(id=group.id).update(token_version=F("token_version") + 1)
    group.refresh_from_db(fields=["token_version"])
    return tokens.mint_group_token(group_id=group.id, token_version=group.token_version)


def runner_group_set_drained(*, group: RunnerGroup, drained: bool) -> RunnerGroup:
    RunnerGroup.objects.filter(id=group.id).update(drained=drained)
    group.refresh_from_db(fields=["drained"])
    if not drained:
        notify_claimable(organization_id=group.organization_id)
    return group


def stack_create(*, org: Organization, name: str, labels: Any = None, spec: Any = None, secrets: Any = None) -> Stack:
    if Stack.objects.filter(organization=org, name=name).exists():
        raise Conflict(f"a stack named {name!r} exists in this organization", code="name_taken")
    return Stack.objects.create(
        organization=org,
        name=name,
        labels=specs.validate_stack_labels(labels or {}),
        spec=specs.validate_spec(spec) if spec else None,
        secrets=_validate_secrets(secrets or {}),
    )


def stack_update(*, stack: Stack, **fields: Any) -> Stack:
    """Change a stack. Existing runs keep the selector they were created with."""
    if "labels" in fields:
        fields["labels"] = specs.validate_stack_labels(fields["labels"])
    if "spec" in fields:
        fields["spec"] = specs.validate_spec(fields["spec"]) if fields["spec"] else None
    if "secrets" in fields:
        fields["secrets"] = _validate_secrets(fields["secrets"])
    if (
        "name" in fields
        and Stack.objects.filter(organization_id=stack.organization_id, name=fields["name"])
        .exclude(id=stack.id)
        .exists()
    ):
        raise Conflict(f"a stack named {fields['name']!r} exists in this organization", code="name_taken")
    for key, value in fields.items():
        setattr(stack, key, value)
    if fields:
        stack.save(update_fields=list(fields))
    return stack


def _validate_secrets(secrets: Any) -> dict[str, str]:
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()):
        raise InvalidRequest("secrets must map strings to strings")
    return dict(secrets)
