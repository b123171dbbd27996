"""Runner rows: ready, seen (/status), deregister, dispatch-failed, lost, force-delete, and the group's reconcile.

A runner *holds* a run while it is executing it (running, requested_cancellation,
cancelling) or was dispatched for it and could still accept (assigned with an
unexpired lease). :data:`HOLDS_RUN_SQL` is that test, written once and used by
deregister, the stub reaper and force-delete's report.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.contrib.auth.models import User
from django.db import connection, transaction

from gantry import conf
from gantry.core import prepared
from gantry.core.errors import GantryError, NotFound, RunnerBusy, RunnerHoldsRun, RunnerNotOffline
from gantry.core.models import (
    EXECUTING,
    TERMINAL,
    LogFlush,
    Run,
    RunEvent,
    Runner,
    RunnerGroup,
    RunnerStatus,
    RunStatus,
)
from gantry.core.services import hotpath
from gantry.core.services.runs import fail_executing_run, run_fail
from gantry.core.services.transitions import resolve_now
from gantry.logs import flush_live_log

log = logging.getLogger("gantry.runners")


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
    if ready_hot(runner_id=runner_id, runner_group_id=None, metadata=metadata, now=now):
        return
    extra = _metadata(metadata)
    current = Runner.objects.filter(id=runner_id).values_list("status", flat=True).first()
    if current is None:
        raise NotFound("runner not found")
    if current == RunnerStatus.BUSY:
        raise RunnerBusy("runner has already accepted its run")
    if extra:
        Runner.objects.filter(id=runner_id).update(**extra)


def ready_hot(*, runner_id: uuid.UUID, runner_group_id: int | None, metadata: dict[str, Any] | None,
              now: datetime) -> bool:  # fmt: skip
    """Ready's common case alone (one statement): True when the runner went not_ready → ready now.

    False changed nothing: the runner is ready already, busy, gone, or not of
    ``runner_group_id`` (None: not checked), and :func:`runner_ready` says which.
    """
    return prepared.drive(ready_hot_plan(runner_id=runner_id, runner_group_id=runner_group_id, metadata=metadata,
                                         now=now))  # fmt: skip


def ready_hot_plan(
    *, runner_id: uuid.UUID, runner_group_id: int | None, metadata: dict[str, Any] | None, now: datetime
) -> prepared.Plan[bool]:
    """:func:`ready_hot` as a plan (gantry.core.prepared), for either driver."""
    return hotpath.ready_plan(runner_id=runner_id, group_id=runner_group_id, metadata=_metadata(metadata), now=now)


def _metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (metadata or {}).items() if k in RUNNER_METADATA and v is not None}


def runner_seen(*, runner_id: uuid.UUID, run_id: uuid.UUID, now: datetime | None = None) -> str:
    """The runner's /status: refresh its liveness and answer its run's status (one statement)."""
    now = resolve_now(now)
    status = hotpath.seen(runner_id=runner_id, run_id=run_id, now=now)
    if status is None:
        raise NotFound("run not found")
    return status


def runner_status(
    *, runner_id: uuid.UUID, runner_group_id: int | None, run_id: uuid.UUID, bound: bool, now: datetime | None = None
) -> tuple[bool, str | None]:
    """/status with the runner's authentication folded in, one round trip (docs/performance.md).

    Answers whether the runner still exists in ``runner_group_id`` and, when
    ``bound`` (the path is the token's run), refreshes its liveness and answers
    the run's status (None: no such run). Unbound or for a runner that is gone,
    it writes nothing.
    """
    return prepared.drive(runner_status_plan(runner_id=runner_id, runner_group_id=runner_group_id, run_id=run_id,
                                             bound=bound, now=resolve_now(now)))  # fmt: skip


def runner_status_plan(
    *, runner_id: uuid.UUID, runner_group_id: int | None, run_id: uuid.UUID, bound: bool, now: datetime
) -> prepared.Plan[tuple[bool, str | None]]:
    """:func:`runner_status` as a plan (gantry.core.prepared), for either driver."""
    return hotpath.status_plan(runner_id=runner_id, group_id=runner_group_id, run_id=run_id, bound=bound, now=now)


_DEREGISTER = hotpath.deregister_statement(holds_run_sql("%(runner)s"))


def runner_deregister(*, runner_id: uuid.UUID, now: datetime | None = None) -> None:
    """Delete the runner row, unless it still holds a run.

    It holds a run while executing it, or while assigned with an unexpired
    lease (it could still accept). A runner whose run was skipped or whose lease
    lapsed can always go: that frees its group slot and, through the FK's ON
    DELETE SET NULL, releases its run for dispatch at once.
    """
    now = resolve_now(now)
    if deregister_hot(runner_id=runner_id, runner_group_id=None, now=now):
        return
    if not Runner.objects.filter(id=runner_id).exists():
        raise NotFound("runner not found")
    raise RunnerHoldsRun("runner still holds a run; finish it (or let its lease lapse) first")


def deregister_hot(*, runner_id: uuid.UUID, runner_group_id: int | None, now: datetime) -> bool:
    """Deregister's common case alone: True when the row (of ``runner_group_id``, when given) was deleted.

    One statement: the NOT EXISTS and the DELETE see the same snapshot, and
    the run row lock taken by a concurrent accept makes that accept commit
    first or see the runner gone. False changed nothing.
    """
    return prepared.drive(deregister_hot_plan(runner_id=runner_id, runner_group_id=runner_group_id, now=now))


def deregister_hot_plan(*, runner_id: uuid.UUID, runner_group_id: int | None, now: datetime) -> prepared.Plan[bool]:
    """:func:`deregister_hot` as a plan (gantry.core.prepared), for either driver."""
    return hotpath.deregister_plan(statement=_DEREGISTER, runner_id=runner_id, group_id=runner_group_id, now=now)


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
            # Its live log is flushed after commit; with the runner row gone,
            # this row is what a failed flush is retried from (LogFlush).
            LogFlush.objects.create(run_id=failed, queued_at=now)
        # The foreign key's SET NULL releases any run still pointing here. An
        # accept locks run then runner, the reverse of this; it cannot be in
        # flight for a runner offline past the gate while the gate is at least
        # the lease (the defaults), and PostgreSQL's deadlock check settles the rest.
        Runner.objects.filter(id=runner_id).delete()
    return failed


#
# Reconcile: the coordinator reports the workers its launcher holds; the
# server settles the ones that exited and names the ones to stop.

# Why a running worker must stop (the ``reason`` of a stop order).
STOP_RUN_TERMINAL = "run_terminal"  # the run ended without it (cancelled, skipped, failed, finished)
STOP_LEASE_LAPSED = "lease_lapsed"  # it never accepted, and now it never can
STOP_RUNNER_GONE = "runner_gone"  # its runner row was deleted (a reaper, a force-delete, a deregister)

STOP_REASONS = (STOP_RUN_TERMINAL, STOP_LEASE_LAPSED, STOP_RUNNER_GONE)

WORKER_RUNNING = "running"
WORKER_EXITED = "exited"
WORKER_STATES = (WORKER_RUNNING, WORKER_EXITED)
# What of a worker's last lines goes into a failure reason.
REASON_LINES = 20
REASON_LINE_CHARS = 300


@dataclass(frozen=True)
class WorkerReport:
    """One worker as its coordinator sees it: still running, or exited (with what it left behind)."""

    run_id: uuid.UUID
    runner_id: uuid.UUID
    state: str
    exit_code: int | None = None
    last_lines: Sequence[str] = ()
    seconds: float | None = None


@dataclass(frozen=True)
class StopOrder:
    run_id: uuid.UUID
    runner_id: uuid.UUID
    reason: str
    run_status: str | None


@dataclass
class Reconciled:
    """The answer to one report."""

    # Running workers the group must stop.
    stop: list[StopOrder] = field(default_factory=list)
    # Exited workers not settled yet (their run's log could not be flushed): report them again.
    retry: list[WorkerReport] = field(default_factory=list)
    # Runs this call failed, and runner rows it deleted.
    failed: list[uuid.UUID] = field(default_factory=list)
    deleted: int = 0
    # Entries that were not the group's to speak of (another group's runner, a run not bound to it).
    ignored: int = 0


def group_reconcile(*, group: RunnerGroup, workers: Sequence[WorkerReport], now: datetime | None = None) -> Reconciled:
    """Settle what a runner group reports of its workers (docs/protocol.md, "Reconcile").

    An *exited* worker whose run it was executing fails that run at once as
    ``runner_exited`` (the exit code and the worker's last lines in the
    reason), its live log is flushed to storage as the final chunk and the
    runner row is deleted; one that exited holding an unexpired lease (before
    it accepted) fails the run as a dispatch failure; any other exited worker
    only has its runner row deleted (deregister semantics: never while it
    holds a run). A *running* worker whose run no longer needs it is answered
    in ``stop``.

    A group speaks only of its own runners: an entry naming another group's
    runner, or a run not bound to that runner, is ignored, whichever group's
    it is, so the answer tells nothing of other groups. A runner row that is
    gone counts as the group's when the run's ``assigned`` event names that
    runner and this group. Every rule is a guarded transition, so a replayed
    report changes nothing.
    """
    now = resolve_now(now)
    run_ids = {w.run_id for w in workers}
    groups = dict(Runner.objects.filter(id__in={w.runner_id for w in workers}).values_list("id", "runner_group_id"))
    runs = {row["id"]: row for row in Run.objects.filter(id__in=run_ids).values(*_RUN_FIELDS)}
    gone = _own_gone_runners(group, [w for w in workers if w.runner_id not in groups])
    result = Reconciled()
    settle: list[WorkerReport] = []
    for w in workers:
        run = runs.get(w.run_id)
        owner = groups.get(w.runner_id)
        if owner is None:
            if (w.run_id, w.runner_id) not in gone:
                result.ignored += 1
            elif w.state == WORKER_RUNNING:
                result.stop.append(StopOrder(w.run_id, w.runner_id, STOP_RUNNER_GONE, run and run["status"]))
            # An exited worker whose runner row is gone: settled already (a replay).
            continue
        if owner != group.id or run is None or run["assigned_runner_id"] != w.runner_id:
            result.ignored += 1
            continue
        if w.state == WORKER_RUNNING:
            reason = _needless(run, now)
            if reason is not None:
                result.stop.append(StopOrder(w.run_id, w.runner_id, reason, run["status"]))
        else:
            settle.append(w)
    for w in settle:
        if _settle_exited(group, w, runs[w.run_id], now, result):
            result.deleted += _delete_runner(group, w.runner_id, now)
    return result


_RUN_FIELDS = ("id", "status", "assigned_runner_id", "assigned_expires_at", "started_at")


def _own_gone_runners(group: RunnerGroup, workers: Sequence[WorkerReport]) -> set[tuple[uuid.UUID, uuid.UUID]]:
    """The (run, runner) pairs among ``workers`` whose runner row is gone but was this group's, claimed for that run.

    The claim's ``assigned`` event names the runner and its group and outlives the row.
    """
    if not workers:
        return set()
    named = {(w.run_id, str(w.runner_id)): w.runner_id for w in workers}
    events = RunEvent.objects.filter(
        run_id__in={w.run_id for w in workers}, kind="assigned", detail__runner_group_id=group.id
    ).values_list("run_id", "detail")
    return {(run_id, named[(run_id, detail.get("runner_id"))]) for run_id, detail in events
            if (run_id, detail.get("runner_id")) in named}  # fmt: skip


def _needless(run: dict[str, Any], now: datetime) -> str | None:
    """Why a running worker for ``run`` (bound to it) should stop, or None while the run still needs it."""
    status = run["status"]
    if status in TERMINAL:
        return STOP_RUN_TERMINAL
    if status in EXECUTING:
        return None
    expires = run["assigned_expires_at"]
    if status == RunStatus.ASSIGNED and expires is not None and expires > now:
        return None  # still starting: it may accept
    # Pending with its pointer kept (the lease was reset) or assigned past its
    # lease: accept would be refused, so the worker can only wait to be told.
    return STOP_LEASE_LAPSED


def _settle_exited(group: RunnerGroup, w: WorkerReport, run: dict[str, Any], now: datetime, result: Reconciled) -> bool:
    """Fail what the exited worker leaves behind and flush its run's log; True when its runner row may go now.

    False after a dispatch failure (that deleted the row itself) and when the
    flush failed (the entry is then in ``result.retry``).
    """
    status = run["status"]
    try:
        if status in EXECUTING:
            fail_executing_run(
                run_id=w.run_id,
                runner_id=w.runner_id,
                reason=f"runner lost: {_exit_words(w)} before it reported the run's end{_lines_words(w)}",
                event="runner_exited",
                detail={"runner_id": str(w.runner_id), "exit_code": w.exit_code, "seconds": w.seconds},
                now=now,
            )
            result.failed.append(w.run_id)
            log.info("run %s failed: its runner's worker exited (code %s)", w.run_id, w.exit_code,
                     extra={"event": "reconcile.runner_exited", "run_id": str(w.run_id),
                            "runner_id": str(w.runner_id), "exit_code": w.exit_code})  # fmt: skip
        elif status == RunStatus.ASSIGNED and run["assigned_expires_at"] and run["assigned_expires_at"] > now:
            # It died holding the lease, before it accepted: it will never
            # start the run, and another launch would likely die the same way.
            dispatch_failed(group=group, run_id=w.run_id, runner_id=w.runner_id,
                            error=f"{_exit_words(w)} before it accepted the run{_lines_words(w)}",
                            now=now)  # fmt: skip
            result.failed.append(w.run_id)
            return False  # dispatch_failed deleted the runner row itself
    except GantryError:
        pass  # its /done, a reaper or a replay got there first: the run is settled
    if status in EXECUTING or (status in TERMINAL and run["started_at"] is not None):
        try:
            flush_live_log(w.run_id)
        except Exception:
            # The runner row stays (busy, silent): a later report, or the
            # inactive-runner reaper, flushes and deletes it.
            log.warning("live-log flush after a worker exited failed; the report will be retried", exc_info=True,
                        extra={"event": "reconcile.flush_failed", "run_id": str(w.run_id)})  # fmt: skip
            result.retry.append(w)
            return False
    return True


def _delete_runner(group: RunnerGroup, runner_id: uuid.UUID, now: datetime) -> int:
    """Deregister semantics for a worker that is gone: the row goes unless it still holds a run."""
    with connection.cursor() as cur:
        cur.execute(
            f"DELETE FROM runner WHERE id = %(runner)s AND runner_group_id = %(group)s "
            f"AND NOT {holds_run_sql('%(runner)s')}",
            {"runner": runner_id, "group": group.id, "now": now},
        )
        return cur.rowcount


def _exit_words(w: WorkerReport) -> str:
    code = w.exit_code
    if code is None:
        how = "exited with an unknown code"
    elif code < 0:
        how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    after = f" after {w.seconds:.1f} s" if w.seconds is not None else ""
    return f"the worker {how}{after}"


def _lines_words(w: WorkerReport) -> str:
    lines = [line[:REASON_LINE_CHARS] for line in w.last_lines[-REASON_LINES:]]
    return "; its last lines:\n" + "\n".join(lines) if lines else ""
