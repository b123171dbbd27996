"""Runner rows: ready, the heartbeat (/status), deregister, dispatch-failed, lost, force-delete, a group's reconcile.

A runner *holds* a run while it is executing it (running, requested_cancellation,
cancelling) or was dispatched for it and could still accept (assigned with an
unexpired lease): ``gantry.sql.runners.holds_run``, written once and used by
deregister, reconcile, the stub reaper and the silent-runner sweep.

Ready, status and deregister are *plans* (gantry.sql.statement), the one path
both the Django views (through the services here) and the fast lane run; each
statement answers the state it judged, and a refusal is explained from it.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.contrib.auth.models import User
from django.db import transaction

from gantry import conf
from gantry.core import words
from gantry.core.errors import NotFound, RunnerBusy, RunnerHoldsRun, RunnerNotOffline
from gantry.core.models import (
    EXECUTING,
    LogFlush,
    Run,
    Runner,
    RunnerGroup,
    RunnerStatus,
)
from gantry.core.services.runs import fail_executing_run
from gantry.core.services.transitions import move, resolve_now
from gantry.sql import runners as sql
from gantry.sql import runs as run_sql
from gantry.sql.statement import Plan, Script, drive

log = logging.getLogger("gantry.runners")

RUNNER_METADATA = ("hostname", "launcher", "pid", "container_id", "pod_name", "workflow_run_id")


def runner_ready(*, runner_id: uuid.UUID, metadata: dict[str, Any] | None = None, now: datetime | None = None) -> None:
    """not_ready → ready, recording where the runner runs.

    Idempotent on ready: the answer is an empty 204, so a lost answer looks to
    the runner like a request that never committed, and it retries. A strict
    edge would fail every replay and strand the runner before it could
    deregister. A busy runner has accepted: it is not replaying, so that is a
    conflict.
    """
    status = drive(ready_plan(runner_id=runner_id, group_id=None, metadata=metadata, now=resolve_now(now)))
    if status is None:
        raise NotFound("runner not found")
    if status == RunnerStatus.BUSY:
        raise RunnerBusy("runner has already accepted its run")


def ready_plan(
    *, runner_id: uuid.UUID, group_id: int | None, metadata: dict[str, Any] | None, now: datetime
) -> Plan[str | None]:
    """Ready as a plan: the runner's status as judged (ready now, unless busy); None: gone, or not of ``group_id``."""
    given = {k: v for k, v in (metadata or {}).items() if k in RUNNER_METADATA and v is not None}
    args = {**{k: given.get(k) for k in RUNNER_METADATA}, "runner": runner_id, "grp": group_id, "now": now}
    # No wait for the WAL flush (as /status): ready only records that the
    # runner is up; accept does not depend on it, and accept's durable commit
    # flushes it along. A database crash inside the flush window loses the
    # stamp, not a run (docs/decisions.md, 13).
    (rows,) = yield Script([(sql.READY, args)], synchronous_commit=False)
    return rows[0][0]


def runner_status(
    *, runner_id: uuid.UUID, runner_group_id: int | None, run_id: uuid.UUID, bound: bool, now: datetime | None = None
) -> tuple[bool, str | None]:
    """/status with the runner's authentication folded in, one round trip.

    Answers whether the runner still exists in ``runner_group_id`` and, when
    ``bound`` (the path is the token's run), refreshes its liveness and answers
    the run's status (None: no such run). Unbound or for a runner that is gone,
    it writes nothing.
    """
    return drive(status_plan(runner_id=runner_id, group_id=runner_group_id, run_id=run_id, bound=bound,
                             now=resolve_now(now)))  # fmt: skip


def status_plan(
    *, runner_id: uuid.UUID, group_id: int | None, run_id: uuid.UUID, bound: bool, now: datetime
) -> Plan[tuple[bool, str | None]]:
    """/status as a plan: (the runner exists in ``group_id``, the run's status; None when missing or not ``bound``)."""
    args = {"runner": runner_id, "grp": group_id, "run": run_id, "bound": bound, "now": now}
    # Its commit does not wait for the WAL flush: the only write is the
    # heartbeat, which the runner repeats every few seconds and the
    # inactive-runner reaper judges over minutes, so a database crash inside
    # the flush window loses nothing that matters (docs/decisions.md, 13).
    ((row,),) = yield Script([(sql.STATUS, args)], synchronous_commit=False)
    return bool(row[0]), row[1]


def runner_deregister(*, runner_id: uuid.UUID, now: datetime | None = None) -> None:
    """Delete the runner row, unless it still holds a run.

    It holds a run while executing it, or while assigned with an unexpired
    lease (it could still accept). A runner whose run was skipped or whose lease
    lapsed can always go: that frees its group slot and, through the FK's ON
    DELETE SET NULL, releases its run for dispatch at once.
    """
    _, holds, gone = drive(deregister_plan(runner_id=runner_id, group_id=None, now=resolve_now(now)))
    if gone:
        return
    if holds:
        raise RunnerHoldsRun("runner still holds a run; finish it (or let its lease lapse) first")
    raise NotFound("runner not found")


def deregister_plan(*, runner_id: uuid.UUID, group_id: int | None, now: datetime) -> Plan[tuple[bool, bool, bool]]:
    """Deregister as a plan: (the runner existed, of ``group_id`` when given; it holds a run; its row went)."""
    args = {"runner": runner_id, "now": now, "grp": group_id}
    # No wait for the WAL flush: a deregister lost in a database crash inside
    # the flush window leaves a runner row whose run is over, which the
    # silent-runner sweep deletes (its slot held until then); the next durable
    # commit flushes it anyway (docs/decisions.md, 13).
    ((row,),) = yield Script([(sql.DEREGISTER, args)], synchronous_commit=False)
    return bool(row[0]), bool(row[1]), bool(row[2])


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
        # A lapsed lease returns the run to pending but keeps the runner pointer: both may fail here.
        run = move(run_sql.FAIL_UNSTARTED, run_id=run_id, now=now, runner=runner_id, reason=f"dispatch failed: {error}")
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


def _when(at: datetime) -> str:
    """A time for a sentence a person reads (the admin's refusal, a run's failure reason): UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
                f"runner was {what} at {_when(seen)}; it may be force-deleted once it has been offline for "
                f"{words.duration(gate.total_seconds())} (GANTRY_RUNNER_FORCE_GATE), from {_when(eligible_at)}",
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
                reason=f"runner {runner_id} was force-deleted{who} after being offline since {_when(seen)}",
                event="force_deleted",
                now=now,
            )
            # Its live log is flushed after commit; with the runner row gone,
            # this row is what a failed flush is retried from (LogFlush).
            LogFlush.objects.create(run_id=failed, queued_at=now)
        # The foreign key's SET NULL releases any run still pointing here. An
        # accept locks run then runner, the reverse of this; it cannot be in
        # flight for a runner offline past the gate while the gate is at least
        # the lease (the defaults), and PostgreSQL's deadlock check settles the rest.
        Runner.objects.filter(id=runner_id).delete()
    return failed
