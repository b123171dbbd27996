"""Runner rows: ready, seen (/status), deregister, dispatch-failed, lost, force-delete.

A runner *holds* a run while it is executing it (running, requested_cancellation,
cancelling) or was dispatched for it and could still accept (assigned with an
unexpired lease). :data:`HOLDS_RUN_SQL` is that test, written once and used by
deregister, the stub reaper and force-delete's report.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.contrib.auth.models import User
from django.db import connection, transaction

from gantry import conf
from gantry.core.errors import NotFound, RunnerBusy, RunnerHoldsRun, RunnerNotOffline
from gantry.core.models import (
    EXECUTING,
    Run,
    Runner,
    RunnerGroup,
    RunnerStatus,
    RunStatus,
)
from gantry.core.services.runs import fail_executing_run, run_fail
from gantry.core.services.transitions import (
    resolve_now,
)


def holds_run_sql(runner: str) -> str:
    """SQL that is true while the runner whose id is the SQL expression ``runner`` still holds a run.

    It holds one while executing it, or while assigned with an unexpired lease
    (it could still accept); the statement supplies ``%(now)s``. The statuses
    are literals from :data:`EXECUTING`, never parameters, so the planner can
    match them against the partial indexes on run.
    """
    executing = ", ".join(f"'{status}'" for status in sorted(EXECUTING))
    return (
        f"EXISTS (SELECT 1 FROM run WHERE run.assigned_runner_id = {runner} AND (run.status IN ({executing}) "
        "OR (run.status = 'assigned' AND run.assigned_expires_at > %(now)s)))"
    )


RUNNER_METADATA = ("hostname", "launcher", "pid", "container_id", "pod_name", "workflow_run_id")


def runner_ready(*, runner_id: uuid.UUID, metadata: dict[str, Any] | None = None, now: datetime | None = None) -> None:
    """not_ready → ready, recording where the runner runs.

    Idempotent on ready: the answer is an empty 204, so a lost answer looks to
    the runner like a request that never committed, and it retries. A strict
    edge would fail every replay and strand the runner before it could
    deregister. A busy runner has accepted: it is not replaying, so that is a
    conflict.
    """
    now = resolve_now(now)
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
        raise RunnerBusy("runner has already accepted its run")
    if extra:
        Runner.objects.filter(id=runner_id).update(**extra)


def runner_seen(*, runner_id: uuid.UUID, run_id: uuid.UUID, now: datetime | None = None) -> str:
    """The runner's /status: refresh its liveness and answer its run's status (one statement)."""
    now = resolve_now(now)
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
    now = resolve_now(now)
    with connection.cursor() as cur:
        # One statement: the NOT EXISTS and the DELETE see the same snapshot,
        # and the run row lock taken by a concurrent accept makes that accept
        # commit first or see the runner gone.
        cur.execute(
            f"DELETE FROM runner WHERE id = %(runner)s AND NOT {holds_run_sql('%(runner)s')} RETURNING id",
            {"runner": runner_id, "now": now},
        )
        if cur.fetchone() is not None:
            return
    if not Runner.objects.filter(id=runner_id).exists():
        raise NotFound("runner not found")
    raise RunnerHoldsRun("runner still holds a run; finish it (or let its lease lapse) first")


def dispatch_failed(
    *, group: RunnerGroup, run_id: uuid.UUID, runner_id: uuid.UUID, error: str, now: datetime | None = None
) -> Run:
    """The group could not start the runner for a run it claimed (ReportDispatchFailure).

    The run fails rather than re-queues: the group knows the launch failed, and
    dispatching it again would fail again in a loop. The stub is deleted and
    the error recorded on the group for operators.
    """
    now = resolve_now(now)
    # Only about a run this group holds: its own runner, bound to that run.
    # Anything else is 404 whatever the run's state, so a group token learns
    # nothing of runs it does not hold (not even that they exist).
    if not Run.objects.filter(
        id=run_id, assigned_runner_id=runner_id, assigned_runner__runner_group_id=group.id
    ).exists():
        raise NotFound("no run of this id is held by that runner of this group")
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


#
# The failure-window reapers (gantry/reapers) select due rows and call these;
# each is guarded, so a second sweep racing the first (or a request racing a
# sweep) changes nothing and is refused instead.


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
    now = resolve_now(now)
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
        fail_executing_run(
            run_id=run_id,
            runner_id=runner_id,
            reason=f"runner lost: runner {runner_id} has not polled its run's status since {seen.isoformat()}",
            event="runner_lost",
            now=now,
        )
    return LostRunner(run_id=run_id, failed=True)


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
    now = resolve_now(now)
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
            raise RunnerNotOffline(
                f"runner was {what} at {seen.isoformat()}; it may be force-deleted once it has been offline for "
                f"{gate.total_seconds():.0f} s (GANTRY_RUNNER_FORCE_GATE), from {eligible_at.isoformat()}",
                eligible_at=eligible_at.isoformat(),
            )
        failed = (
            Run.objects.filter(assigned_runner_id=runner_id, status__in=sorted(EXECUTING))
            .values_list("id", flat=True)
            .first()
        )
        if failed is not None:
            who = f" by {by.get_username()}" if by is not None else ""
            fail_executing_run(
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
