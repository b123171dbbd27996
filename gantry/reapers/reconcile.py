"""Reconcile: a group's coordinator reports the workers its launcher holds (docs/protocol.md, "Reconcile").

The server settles the workers that exited (their runs failed through the
services, their live logs flushed to storage, their runner rows deleted) and
names the running ones to stop. It lives beside the reapers, not in the
services, because settling a worker writes its log to storage between two
edges: the services never call storage.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from gantry.core import services
from gantry.core.errors import GantryError
from gantry.core.models import EXECUTING, TERMINAL, Run, RunEvent, Runner, RunnerGroup, RunStatus
from gantry.logs import flush_live_log
from gantry.sql import runners as sql

log = logging.getLogger("gantry.runners")

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
    now = now if now is not None else timezone.now()
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
            services.fail_executing_run(
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
            services.dispatch_failed(group=group, run_id=w.run_id, runner_id=w.runner_id,
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
        cur.execute(sql.DELETE_OF_GROUP, {"runner": runner_id, "group": group.id, "now": now})
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
