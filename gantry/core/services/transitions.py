"""The building blocks every run transition is made of (docs/design.md, "The run state machine").

A transition is one guarded UPDATE (``WHERE id = … AND status IN (expected)``):
anything but one row changed is a conflict, never a silent overwrite, and each
transition writes a ``run_event`` and brings its deployment's status along.

Lanes: a run becoming or ceasing to be its stack's lane holder locks the stack
row first (``FOR NO KEY UPDATE``), always in the order stack → run. That
serialises deployment creation against the promotion of the stack's next run,
so a run queued while the lane holder finishes can never be left queued behind
no holder. The partial unique index ``run_one_lane_holder_per_stack`` remains
the last word. ``terminate`` ends a run and promotes its stack's next one in
the same transaction.

These are the service modules' own tools, not part of ``services``' public face.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists
from django.utils import timezone

from gantry import metrics
from gantry.core.errors import InvalidTransition, NotFound, RunTerminal
from gantry.core.models import (
    DEPLOYMENT_STATUS_FOR_RUN,
    LANE_HOLDERS,
    TERMINAL,
    Deployment,
    Run,
    RunEvent,
    RunSelector,
    RunStatus,
    RunToken,
    Stack,
)
from gantry.core.services import bulk

NOTIFY_CHANNEL = "gantry_claimable"


def resolve_now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


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


def lock_stack(stack_id: int) -> None:
    # NO KEY UPDATE: serialises lane changes among themselves without blocking
    # the KEY SHARE lock that inserting a run (FK to stack) takes.
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM stack WHERE id = %s FOR NO KEY UPDATE", [stack_id])
        if cur.fetchone() is None:
            raise NotFound("stack not found")


def write_event(run_id: uuid.UUID, kind: str, now: datetime, /, **detail: Any) -> None:
    RunEvent.objects.create(run_id=run_id, kind=kind, at=now, detail=detail)


def sync_deployment(run: Run, now: datetime) -> None:
    """A deployment's status follows its newest run."""
    newer = Run.objects.filter(deployment_id=run.deployment_id, attempt__gt=run.attempt)
    Deployment.objects.filter(id=run.deployment_id).exclude(status=DEPLOYMENT_STATUS_FOR_RUN[run.status]).filter(
        ~Exists(newer)
    ).update(status=DEPLOYMENT_STATUS_FOR_RUN[run.status], updated_at=now)


def refusal(run_id: uuid.UUID, target: str, expected: Iterable[str], guard: str = "") -> Exception:
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


def transition(
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
        raise refusal(run_id, target, expected, guard)
    write_event(run_id, event, now, **(detail or {}))
    run = Run.objects.get(id=run_id)
    sync_deployment(run, now)
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
            [organization_id, canonical_json(selector)],
        )
    return RunSelector.objects.get(organization_id=organization_id, selector=selector).id


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def run_create_on_lane(
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
    write_event(run.id, "created", now, status=run.status, attempt=attempt, **(detail or {}))
    sync_deployment(run, now)
    return run


def stack_promote_next(*, stack_id: int, now: datetime | None = None) -> Run | None:
    """PromoteNextOnStack: when the lane is free, its oldest queued run becomes pending.

    Called inside the transaction that freed the lane, with the stack locked.
    ``first_pending_at`` is stamped the first time only: the startup deadline
    counts from a run's original eligibility. One statement, the reapers' own
    (``bulk.promote_lanes``), for one stack.
    """
    promoted = bulk.promote_lanes([stack_id], now=resolve_now(now))
    return Run.objects.get(id=promoted[0]) if promoted else None


def terminate(
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
        lock_stack(stack_id)
        run = transition(
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
        transaction.on_commit(partial(record_finished, run))
    return run


def record_finished(run: Run) -> None:
    """Count a finished run in the metrics; called on commit."""
    # After commit: a rolled-back transition is never counted.
    timings = {}
    if run.first_pending_at is not None and run.finished_at is not None:  # a run skipped while queued never pended
        timings["pending_to_finished"] = (run.finished_at - run.first_pending_at).total_seconds()
    metrics.record_run(organization_id=run.organization_id, timings=timings, finished=run.status)
