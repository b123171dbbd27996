"""Deployments: queue one (its run takes the stack's lane or queues behind it), skip it, retry it; archive a stack."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from gantry.core import specs
from gantry.core.errors import (
    IdempotencyKeyReused,
    InvalidRequest,
    InvalidTransition,
    NotFound,
    NotRetryable,
    NotSkippable,
    PriorityForbidden,
    StackArchived,
    StackBusy,
)
from gantry.core.models import (
    NEVER_STARTED,
    RUNNER_BOUND,
    TERMINAL,
    Deployment,
    Priority,
    Run,
    RunStatus,
    Stack,
)
from gantry.core.services.runs import run_request_cancellation
from gantry.core.services.transitions import detail_json, move, resolve_now, run_create_on_lane
from gantry.sql import runs as sql


def may_queue_priority(priority: int, *, admin: bool) -> bool:
    """Whether a caller may queue a deployment at ``priority``: high only for an org admin.

    Going ahead of everyone's runs is the org's (an admin's) call, else every
    member's run would be high. The API and the pages ask this one rule.
    """
    return admin or priority != Priority.HIGH


def check_queue_priority(priority: int | None, *, admin: bool) -> None:
    """Refuse (403 ``priority_forbidden``) a priority the caller may not queue; None (the stack's default) passes."""
    if priority is not None and not may_queue_priority(priority, admin=admin):
        raise PriorityForbidden("only an org admin may queue a deployment with priority high")


def deployment_create(
    *,
    stack: Stack,
    spec: dict[str, Any] | None = None,
    priority: int | None = None,
    created_by: User | None = None,
    now: datetime | None = None,
) -> Deployment:
    """Queue a deployment: its run is pending when the stack's lane is free, else queued.

    Its run has ``priority``, else the stack's ``default_priority`` (who may ask for which is the caller's check).
    """
    deployment, _ = deployment_create_once(stack=stack, spec=spec, priority=priority, created_by=created_by, now=now)
    return deployment


IDEMPOTENCY_KEY_MAX = 255


def check_idempotency_key(key: str) -> None:
    """A usable Idempotency-Key: 1 to 255 visible ASCII characters (400 ``invalid_request`` otherwise)."""
    if not 0 < len(key) <= IDEMPOTENCY_KEY_MAX or not all("!" <= c <= "~" for c in key):
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} visible ASCII characters", field="Idempotency-Key"
        )


def deployment_create_once(
    *,
    stack: Stack,
    spec: dict[str, Any] | None = None,
    priority: int | None = None,
    created_by: User | None = None,
    idempotency_key: str | None = None,
    now: datetime | None = None,
) -> tuple[Deployment, bool]:
    """:func:`deployment_create`, once per ``idempotency_key`` on the stack; the deployment and whether it was
    there already.

    A retry of the same request (same stack, key, user and spec) answers the
    deployment the first one made and queues nothing; the same key with another
    spec or user is ``idempotency_key_reused``. The check runs under the
    stack's lane lock, which every deployment of the stack takes first, so two
    retries racing each other cannot both create (the partial unique index
    deployment_idempotency_uniq stands behind it).
    """
    now = resolve_now(now)
    if spec is None:
        if not stack.spec:
            raise InvalidRequest("the stack has no default spec; pass one")
        spec = stack.spec
    clean = specs.validate_spec(spec)
    with transaction.atomic():
        lock_live_stack(stack.id)
        if idempotency_key is not None:
            earlier = Deployment.objects.filter(stack=stack, idempotency_key=idempotency_key).first()
            if earlier is not None:
                if earlier.spec != clean or earlier.created_by_id != (created_by.pk if created_by else None):
                    raise IdempotencyKeyReused(
                        "this Idempotency-Key was used on this stack for another request: use a new key",
                        deployment_id=earlier.id,
                    )
                return earlier, True
        deployment = Deployment.objects.create(
            stack=stack,
            spec=clean,
            created_by=created_by,
            created_at=now,
            updated_at=now,
            idempotency_key=idempotency_key,
        )
        run_create_on_lane(
            deployment=deployment,
            stack=stack,
            attempt=1,
            now=now,
            priority=stack.default_priority if priority is None else priority,
        )
    deployment.refresh_from_db()
    return deployment, False


def lock_live_stack(stack_id: int) -> None:
    """Lock the stack's lane (as ``transitions.lock_stack``) and answer its ``archived_at``.

    Every path that puts a run on a lane (deploy, retry) comes through here and
    is refused for an archived stack. ``stack_archive`` takes the same lock
    first, so a deployment either commits before the archive (which then
    cancels its run) or waits for it and is refused.
    """
    rows = list(Stack.objects.select_for_update(no_key=True).filter(id=stack_id).values_list("archived_at", flat=True))
    if not rows:
        raise NotFound("stack not found")
    if rows[0] is not None:
        raise StackArchived("the stack is archived: it takes no new deployment", archived_at=rows[0].isoformat())


def newest_run(deployment_id: int) -> Run:
    run = Run.objects.filter(deployment_id=deployment_id).order_by("-attempt").first()
    if run is None:
        raise NotFound("deployment not found")
    return run


def deployment_skip(*, deployment_id: int, by: User | None = None, now: datetime | None = None) -> Deployment:
    """Skip a deployment whose run never started: the run is discarded, its lane released."""
    now = resolve_now(now)
    run = newest_run(deployment_id)
    if run.status not in NEVER_STARTED:
        raise NotSkippable(
            f"only a deployment that has not started can be skipped; its run is {run.status}", status=run.status
        )
    detail = detail_json({"by": by.get_username()} if by is not None else {})
    try:
        move(sql.SKIP, run_id=run.id, now=now, detail=detail)
    except InvalidTransition as exc:
        raise NotSkippable(exc.detail, **exc.extra) from exc
    return Deployment.objects.get(id=deployment_id)


RETRYABLE = frozenset({RunStatus.FAILURE, RunStatus.STARTUP_TIMEOUT, RunStatus.CANCELLED})


def deployment_retry(*, deployment_id: int, by: User | None = None, now: datetime | None = None) -> Deployment:
    """A new attempt of a failed, timed-out or cancelled deployment; it queues on the stack's lane."""
    now = resolve_now(now)
    deployment = Deployment.objects.select_related("stack").filter(id=deployment_id).first()
    if deployment is None:
        raise NotFound("deployment not found")
    with transaction.atomic():
        lock_live_stack(deployment.stack_id)
        # Read under the stack lock: two retries of one deployment serialise here.
        run = newest_run(deployment_id)
        if run.status not in RETRYABLE:
            raise NotRetryable(
                f"only a failed, timed-out or cancelled deployment can be retried; its run is {run.status}",
                status=run.status,
            )
        # One transition, one event: the retry's origin goes into its "created" event
        # (it used to be a second, separate "retry_of" event on the same run).
        retry_detail = {"retry_of": str(run.id), **({"by": by.get_username()} if by else {})}
        # The new attempt keeps the priority its deployment's last run had (an admin's change included).
        run_create_on_lane(
            deployment=deployment,
            stack=deployment.stack,
            attempt=run.attempt + 1,
            now=now,
            priority=run.priority,
            detail=retry_detail,
        )
    deployment.refresh_from_db()
    return deployment


def stack_archive(*, stack_id: int, by: User | None = None, now: datetime | None = None) -> Stack:
    """Archive a stack: its waiting runs are cancelled, it leaves the lists and takes no deployment.

    Refused (StackBusy) while one of its runs is claimed or executing: that run
    is cancelled or finishes first. Its history (deployments, finished runs)
    stays readable. Archiving an archived stack changes nothing.

    Race-safe against the poll's claim: the stack's unfinished runs are locked
    ``FOR UPDATE`` before they are judged. A claim that locked one first (its
    ``FOR UPDATE SKIP LOCKED``) has committed by the time our lock returns, and
    the run reads as assigned: busy, and the whole archive rolls back. A claim
    that comes after skips the rows we hold, and finds them cancelled once we
    commit. Deploy and retry take the stack's lock, which is held here from the
    start, and then see ``archived_at``.
    """
    now = resolve_now(now)
    with transaction.atomic():
        try:
            lock_live_stack(stack_id)
        except StackArchived:
            return Stack.objects.get(id=stack_id)
        unfinished = list(
            Run.objects.select_for_update()
            .filter(stack_id=stack_id)
            .exclude(status__in=sorted(TERMINAL))
            .order_by("created_at", "id")
            .values_list("id", "status")
        )
        busy = [(run_id, status) for run_id, status in unfinished if status in RUNNER_BOUND]
        if busy:
            run_id, status = busy[0]
            raise StackBusy(
                f"run {run_id} of this stack is {status}: cancel it or let it finish, then archive",
                run_id=str(run_id),
                status=status,
            )
        # Queued runs first: cancelling the lane holder (pending) first would promote
        # the next queued run, a "promoted" event in its history for a run never to start.
        for run_id, _status in sorted(unfinished, key=lambda r: r[1] != RunStatus.QUEUED):
            run_request_cancellation(run_id=run_id, by=by, now=now)
        Stack.objects.filter(id=stack_id, archived_at__isnull=True).update(archived_at=now)
    return Stack.objects.get(id=stack_id)
