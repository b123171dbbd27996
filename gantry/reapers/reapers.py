"""The failure-window reapers (docs/design.md §6, "Failure Windows", "Reaping the runner row").

Each reaper is a function of ``now`` that answers what it did. Celery beat
runs them every ``GANTRY_REAPER_INTERVAL`` seconds (``gantry.reapers.tasks``);
``manage.py reap`` runs them by hand, at any ``--now``.

How a sweep works (docs/reapers.md, "Set-based sweeps"):

1. It selects due ids in batches, oldest deadline first, with one statement
   that a partial index answers (migration core/0005), so its cost follows
   the due rows, never the table. The selection takes no locks.
2. Each batch is then moved in one transaction of a few statements
   (``gantry.core.services.bulk``): the stacks locked in id order when lanes change
   (the services' order, stack → run), one guarded ``UPDATE … RETURNING``
   that repeats the per-row service's guard and skips rows other
   transactions hold locked, with the batch's events and deployments in the
   same statement, and one statement promoting the freed lanes. A row that
   changed since the selection, or that a second sweep (a second beat, a
   manual ``reap``) or a request moved first, is not returned: it counts as
   ``skipped`` and is never overwritten.
3. Batches continue after the last row's (deadline, id), so a row that was
   skipped is not selected again in the same sweep, and a sweep takes at
   most ``max_rows`` rows: the rest waits for the next tick.

Side effects outside PostgreSQL run after the batch commits: finished-run
metrics in one Redis pipeline, a lost run's live log flushed to storage a
batch at a time (``gantry.logs.flush_live_logs``), and only then its runner
row deleted, so a failed flush leaves the runner for the next sweep to retry.
NOTIFY comes from the same triggers as the API's (migration 0004).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.db import connection, transaction

from gantry import conf, metrics
from gantry.core import services
from gantry.core.models import EXECUTING
from gantry.core.services import bulk
from gantry.logs import flush_live_logs, start_flush
from gantry.logs.services import PendingFlush
from gantry.reapers import stubs
from gantry.sql import reapers as sql

log = logging.getLogger("gantry.reapers")
_T = TypeVar("_T")

# Rows per batch (one transaction), and most rows one sweep of one reaper
# takes. A batch is a few statements and tens of milliseconds, and its locks
# (stacks, runs) last that long. A due row costs a sweep well under a
# millisecond (docs/performance.md), so a bounded sweep fits a one-minute tick
# on a busy two-core machine with room to spare (10,000 lost runners, their
# logs flushed, in one tick); a larger backlog drains over ticks, and a tick
# that cannot start in time expires instead of piling up.
BATCH_SIZE = 500
MAX_ROWS = 20_000
# A sweep gives up after this many unexpected errors (the database is likely
# down); each is logged with its traceback and costs only its batch (rolled
# back, due again next tick), and the next tick starts afresh.
MAX_ERRORS = 10

# The keyset start: before every (deadline, id).
_BEFORE_ALL = (datetime(1, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


@dataclass
class SweepResult:
    reaper: str
    now: datetime
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def acted(self) -> int:
        """Rows this sweep changed (everything but ``skipped``, ``error`` and the failures left for a retry)."""
        return sum(n for k, n in self.counts.items() if k not in ("skipped", "error", "flush_failed", "purge_failed"))

    def summary(self) -> str:
        outcomes = metrics.REAPER_OUTCOMES[self.reaper]
        quiet = ("error", "flush_failed", "purge_failed")
        parts = [f"{k}={self.counts[k]}" for k in outcomes if self.counts[k] or k not in quiet]
        return f"{self.reaper}: {' '.join(parts)} in {self.seconds * 1000:.1f} ms"


# --------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------


def _due(statement: str, params: dict[str, Any], *, batch_size: int, max_rows: int) -> Iterator[list[uuid.UUID]]:
    """The due ids, ``batch_size`` at a time in (key, id) order, at most ``max_rows`` in all.

    ``statement`` is one of gantry.sql.reapers' selections, each answering (key, id).
    """
    (after_key, after_id), taken = _BEFORE_ALL, 0
    while taken < max_rows:
        limit = min(batch_size, max_rows - taken)
        with connection.cursor() as cur:
            cur.execute(statement, {**params, "after_key": after_key, "after_id": after_id, "limit": limit})
            rows = cur.fetchall()
        if rows:
            yield [row_id for _, row_id in rows]
        taken += len(rows)
        if len(rows) < limit:
            return
        after_key, after_id = rows[-1]


# --------------------------------------------------------------------------
# Sweeps
# --------------------------------------------------------------------------


class _Sweep:
    """Times a sweep, counts its outcomes, and records both (metrics, one log line)."""

    def __init__(self, reaper: str, now: datetime) -> None:
        self.result = SweepResult(reaper=reaper, now=now)
        self._start = 0.0

    def __enter__(self) -> _Sweep:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        result = self.result
        result.seconds = time.perf_counter() - self._start
        metrics.record_reaped(result.reaper, result.counts, result.seconds)
        if result.acted or result.counts["error"] or exc[0] is not None:
            log.info(
                "%s",
                result.summary(),
                extra={"event": f"reaper.{result.reaper}", "counts": dict(result.counts), "now": result.now},
            )

    def batch(self, work: Callable[[], _T]) -> _T | None:
        """Run one batch; a failure counts as ``error`` (the batch rolled back) and the sweep goes on."""
        try:
            return work()
        except Exception:
            counts = self.result.counts
            counts["error"] += 1
            log.exception("reaper batch failed", extra={"event": f"reaper.{self.result.reaper}.error"})
            if counts["error"] >= MAX_ERRORS:
                raise
            return None

    def count(self, outcome: str, ids: list[uuid.UUID], moved: list[Any] | None) -> None:
        """Count a batch: the rows it moved as ``outcome``, the rest of its selection as ``skipped``."""
        if moved is not None:
            self.result.counts[outcome] += len(moved)
            self.result.counts["skipped"] += len(ids) - len(moved)


def reset_expired_assignments(*, now: datetime, batch_size: int = BATCH_SIZE, max_rows: int = MAX_ROWS) -> SweepResult:
    """Assigned runs past their lease go back to pending; the lease is cleared, the runner pointer kept.

    Keeping the pointer keeps the run out of dispatch while its runner may still
    boot (One Runner Per Run); the stub reaper or a deregister releases it.
    The per-row form is ``services.run_reset_lease``; the lane does not change.
    """

    with _Sweep("expired_assignments", now) as sweep:
        for ids in _due(sql.EXPIRED_ASSIGNMENTS, {"now": now}, batch_size=batch_size, max_rows=max_rows):
            sweep.count("reset", ids, sweep.batch(partial(bulk.reset_leases, ids, now=now)))
    return sweep.result


def startup_deadline(*, now: datetime, batch_size: int = BATCH_SIZE, max_rows: int = MAX_ROWS) -> SweepResult:
    """Runs never started within ``GANTRY_RUNNER_STARTUP_DEADLINE`` of first becoming pending → startup_timeout.

    ``first_pending_at`` survives re-queue cycles, so the deadline counts from
    the run's original eligibility. The deployment fails and the lane moves on.
    An assigned run qualifies only once its lease lapsed (``services.run_startup_timeout``'s guard).
    """
    deadline = now - timedelta(seconds=conf.get().runner_startup_deadline)
    params = {"now": now, "deadline": deadline}
    with _Sweep("startup_deadline", now) as sweep:
        for ids in _due(sql.STARTUP_DEADLINE, params, batch_size=batch_size, max_rows=max_rows):
            work = partial(bulk.startup_timeouts, ids, now=now, deadline=deadline)
            sweep.count("timed_out", ids, sweep.batch(work))
    return sweep.result


def inactive_runners(*, now: datetime, batch_size: int = BATCH_SIZE, max_rows: int = MAX_ROWS) -> SweepResult:
    """DeleteInactive: stubs past ``GANTRY_STUB_CUTOFF`` go; busy runners silent past the execution timeout are lost.

    Stubs (not_ready, or ready and never accepted) are deleted set-based; the
    foreign key frees their run for dispatch. Both age from ``created_at``, not
    ``ready_at``: the stub's claim leased its run from the moment the stub was
    created, and once that lease lapsed the runner can never accept — ready or
    not — so a ready stub has nothing left to wait for. Aging it from
    ``ready_at`` would only keep a dead row (and its run, and a group slot)
    longer, and a replayed /ready would not move it.

    A silent busy runner's run fails as runner lost (lane promoted), its live
    log is flushed to storage as the final chunk, and the runner is deleted.
    """
    cfg = conf.get()
    created_before = now - timedelta(seconds=cfg.stub_cutoff)
    silent_before = now - timedelta(seconds=cfg.runner_execution_timeout)
    with _Sweep("inactive_runners", now) as sweep:
        counts = sweep.result.counts
        after, examined = _BEFORE_ALL, 0
        while examined < max_rows:
            limit = min(batch_size, max_rows - examined)
            batch = stubs.runner_delete_stubs(created_before=created_before, now=now, limit=limit, after=after)
            counts["stub_deleted"] += len(batch.deleted)
            examined += batch.examined
            if batch.last is None or batch.examined < limit:
                break
            after = batch.last
        params = {"silent_before": silent_before}
        # Pipelined: a batch's storage writes run while the previous batch is
        # settled and the next one is failed, all database work on this thread.
        pending: _LostBatch | None = None
        for ids in _due(sql.SILENT_RUNNERS, params, batch_size=batch_size, max_rows=max_rows):
            started = sweep.batch(partial(_fail_silent_runners, sweep, ids, silent_before=silent_before, now=now))
            if pending is not None:
                sweep.batch(partial(_settle_lost, sweep, pending, now=now))
            pending = started
        if pending is not None:
            sweep.batch(partial(_settle_lost, sweep, pending, now=now))
        _flush_queued_runs(sweep, batch_size=batch_size, max_rows=max_rows)
    return sweep.result


@dataclass
class _LostBatch:
    """A batch of silent runners whose runs are failed and whose live logs are being flushed."""

    # Runners done with (their run finished: failed now, or before), and the run each accepted.
    settled: list[uuid.UUID]
    accepted: dict[uuid.UUID, uuid.UUID]
    flush: PendingFlush


def _fail_silent_runners(sweep: _Sweep, ids: list[uuid.UUID], *, silent_before: datetime, now: datetime) -> _LostBatch:
    """Fail the runs of a batch of silent runners (one transaction), then start flushing their live logs.

    Each step is re-done by the next sweep if this one stops half-way: a
    runner stays busy and silent until its row is deleted, and its row is
    deleted only once its run's log is safely in storage (:func:`_settle_lost`).
    """
    counts = sweep.result.counts
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(sql.LOCK_SILENT, {"ids": ids, "silent_before": silent_before})
            seen = dict(cur.fetchall())
            cur.execute(sql.ACCEPTED_RUNS, {"runners": list(seen)})
            accepted = {runner: (run, status) for runner, run, status in cur.fetchall()}
        executing = [(runner, run) for runner, (run, status) in accepted.items() if status in EXECUTING]
        moved: list[bulk.Moved] = []
        if executing:
            moved = bulk.lose_runs(
                [run for _, run in executing],
                reasons=[
                    f"runner lost: runner {runner} has not polled its run's status since {seen[runner].isoformat()}"
                    for runner, _ in executing
                ],
                runners=[runner for runner, _ in executing],
                now=now,
            )
    counts["runner_lost"] += len(moved)
    failed_now = {m.id for m in moved}
    # A runner whose run another transaction moved (or holds) meanwhile is left for the next sweep.
    settled = [r for r in seen if r not in accepted or accepted[r][1] not in EXECUTING or accepted[r][0] in failed_now]
    counts["skipped"] += len(ids) - len(settled)
    runs = {r: accepted[r][0] for r in settled if r in accepted}
    return _LostBatch(settled=settled, accepted=runs, flush=start_flush(list(runs.values())))


def _settle_lost(sweep: _Sweep, batch: _LostBatch, *, now: datetime) -> None:
    """Record a batch's flushed logs, then delete its runners, except those whose flush failed (kept for a retry)."""
    counts = sweep.result.counts
    # The runs' pointers to their runners are cleared with their manifests (one row version each).
    flushed = batch.flush.finish(release={run: runner for runner, run in batch.accepted.items()})
    if flushed.failed:
        counts["flush_failed"] += len(flushed.failed)
        log.warning(
            "live-log flush failed for %d run(s); their runners are kept and retried next sweep",
            len(flushed.failed),
            extra={"event": "reaper.flush_failed", "run_ids": [str(run) for run in flushed.failed]},
        )
    deletable = [r for r in batch.settled if batch.accepted.get(r) not in flushed.failed]
    deleted = _delete_runners(deletable, now=now)
    counts["runner_deleted"] += len(deleted)
    counts["skipped"] += len(deletable) - len(deleted)


def _delete_runners(ids: Iterable[uuid.UUID], *, now: datetime) -> list[uuid.UUID]:
    ids = list(ids)
    if not ids:
        return []
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.DELETE_RUNNERS, {"ids": ids, "now": now})
        return [row[0] for row in cur.fetchall()]


def cancellation_backstop(*, now: datetime, batch_size: int = BATCH_SIZE, max_rows: int = MAX_ROWS) -> SweepResult:
    """Never-started runs stuck in requested_cancellation, lease lapsed → cancelled, lane promoted.

    No service creates this state any more; a run already in it would hold its
    stack's lane for ever (docs/design.md §6: a backstop, not a routine window).
    The per-row form is ``services.run_cancel_backstop``.
    """
    params = {"now": now}
    with _Sweep("cancellation_backstop", now) as sweep:
        for ids in _due(sql.CANCELLATION_BACKSTOP, params, batch_size=batch_size, max_rows=max_rows):
            work = partial(bulk.cancel_backstops, ids, now=now)
            sweep.count("cancelled", ids, sweep.batch(work))
    return sweep.result


def retention(*, now: datetime, batch_size: int | None = None, max_rows: int | None = None) -> SweepResult:
    """Finished runs past ``GANTRY_RETENTION_DAYS`` go, with their events, logs and live records (``retention``)."""
    from gantry.reapers import retention as retention_reaper

    with _Sweep("retention", now) as sweep:
        retention_reaper.sweep(sweep.result.counts, sweep.batch, now=now, batch_size=batch_size, max_rows=max_rows)
    return sweep.result


# The order ``reap`` runs them in (beat runs each as its own task): the stub
# reaper frees runs whose lease was just reset; the startup deadline then
# sees every run the others left; retention comes last.
REAPERS: dict[str, Callable[..., SweepResult]] = {
    "expired_assignments": reset_expired_assignments,
    "inactive_runners": inactive_runners,
    "startup_deadline": startup_deadline,
    "cancellation_backstop": cancellation_backstop,
    "retention": retention,
}


def reap(*, now: datetime, only: list[str] | None = None) -> list[SweepResult]:
    """Run the named reapers (all by default) once, as of ``now``."""
    return [REAPERS[name](now=now) for name in (only or REAPERS)]


# --------------------------------------------------------------------------
# Force-delete
# --------------------------------------------------------------------------


def force_delete_runner(*, runner_id: uuid.UUID, by: User | None = None, now: datetime) -> uuid.UUID | None:
    """Force-delete a runner offline past the gate (``services.runner_force_delete``), then flush its run's live log.

    The one entry point of the API and the admin action, one row at a time
    (an operator's action, not a sweep). The flush is a slow side effect (log
    storage), so it runs after the service's transaction.
    """
    failed = services.runner_force_delete(runner_id=runner_id, by=by, now=now)
    metrics.record_reaped("force_delete", {"runner_deleted": 1, "run_failed": int(failed is not None)})
    if failed is not None:
        error: Exception | None = None
        try:
            flushed = flush_queued(Counter(), [failed])
        except Exception as exc:  # Redis or the database failing: the same retry as a failed storage write
            flushed, error = False, exc
        if not flushed:
            # The service queued the run (LogFlush): the inactive-runner
            # reaper retries the flush each tick; the live record stays meanwhile.
            log.error(
                "live-log flush after force-delete failed; the inactive-runner reaper retries it",
                exc_info=error,
                extra={"event": "reaper.force_delete.flush_failed", "run_id": str(failed)},
            )
    return failed


def flush_queued(counts: Counter[str], run_ids: list[uuid.UUID]) -> bool:
    """Flush the live logs of queued runs (``LogFlush``); the rows of those flushed, or with nothing left to
    flush, go. A run whose flush failed keeps its row (``flush_failed``) for the next try. True: none failed."""
    flushed = flush_live_logs(run_ids)
    for run_id, exc in flushed.failed.items():
        log.warning("queued live-log flush failed; retried next tick", exc_info=exc,
                    extra={"event": "reaper.queued_flush_failed", "run_id": str(run_id)})  # fmt: skip
    done = [run_id for run_id in run_ids if run_id not in flushed.failed]
    with connection.cursor() as cur:
        cur.execute(sql.DELETE_FLUSHES, [done])
    counts["log_flushed"] += len(flushed.recorded)
    counts["flush_failed"] += len(flushed.failed)
    return not flushed.failed


def _flush_queued_runs(sweep: _Sweep, *, batch_size: int, max_rows: int) -> None:
    """Retry the queued flushes (force-deletes whose flush failed), oldest first, a batch at a time."""
    done = 0
    while done < max_rows:
        with connection.cursor() as cur:
            cur.execute(sql.QUEUED_FLUSHES, [min(batch_size, max_rows - done)])
            ids = [row[0] for row in cur.fetchall()]
        if not ids:
            return
        if not sweep.batch(partial(flush_queued, sweep.result.counts, ids)):
            return  # storage (or Redis) is failing: the rest waits for the next tick
        done += len(ids)
