"""Deployments: queue one (its run takes the stack's lane or queues behind it), skip it, retry it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from gantry.core import specs
from gantry.core.errors import InvalidRequest, InvalidTransition, NotFound, NotRetryable, NotSkippable
from gantry.core.models import (
    NEVER_STARTED,
    Deployment,
    Run,
    RunStatus,
    Stack,
)
from gantry.core.services.transitions import detail_json, lock_stack, move, resolve_now, run_create_on_lane
from gantry.sql import runs as sql


def deployment_create(
    *,
    stack: Stack,
    spec: dict[str, Any] | None = None,
    created_by: User | None = None,
    now: datetime | None = None,
) -> Deployment:
    """Queue a deployment: its run is pending when the stack's lane is free, else queued."""
    now = resolve_now(now)
    if spec is None:
        if not stack.spec:
            raise InvalidRequest("the stack has no default spec; pass one")
        spec = stack.spec
    clean = specs.validate_spec(spec)
    with transaction.atomic():
        lock_stack(stack.id)
        deployment = Deployment.objects.create(
            stack=stack, spec=clean, created_by=created_by, created_at=now, updated_at=now
        )
        run_create_on_lane(deployment=deployment, stack=stack, attempt=1, now=now)
    deployment.refresh_from_db()
    return deployment


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
        lock_stack(deployment.stack_id)
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
        run_create_on_lane(
            deployment=deployment, stack=deployment.stack, attempt=run.attempt + 1, now=now, detail=retry_detail
        )
    deployment.refresh_from_db()
    return deployment
