"""The failure-window reapers (docs/design.md §6, "Failure Windows", "Reaping the runner row").

Each reaper is a function of ``now`` that answers what it did. Celery beat
runs them every ``GANTRY_REAPER_INTERVAL`` seconds (``gantry.reapers.tasks``);
``manage.py reap`` runs them by hand, at any ``--now``.

How a sweep works:

1. It selects due rows in batches, oldest deadline first, with one statement
   that a partial index answers (migration core/0005), so its cost follows
   the due rows, never the table. The selection runs in a short transaction
   ``FOR UPDATE SKIP LOCKED``: a row some request is changing at this moment
   is left for the next sweep instead of waited on. The locks are released
   before any transition: the services lock stack → run, and holding run
   locks while they take the stack lock would invert that order and deadlock
   against /done or a cancellation.
2. Each selected row then goes through its state-machine service, whose
   guarded UPDATE (``WHERE status IN (…) AND <deadline still passed>``) is
   what makes a transition happen once. A second sweep running at the same
   time (a second beat, a manual ``reap``) or a request that got there first
   makes the service refuse; the refusal is counted as ``skipped``.
3. Batches continue after the last row's (deadline, id), so a row that was
   refused or skipped is not selected again in the same sweep, and a sweep
   takes at most ``max_rows`` rows: the rest waits for the next tick.

Every transition goes through ``gantry.core.services``, writes its run_event,
and makes its run claimable (NOTIFY) by the same triggers as the API.
"""

from __future__ import annotations

import importlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction

from gantry import conf, metrics
from gantry.core import services
from gantry.core.errors import GantryError
from gantry.reapers import stubs

log = logging.getLogger("gantry.reapers")

# Rows per selection, and most rows one sweep of one reaper takes. Selecting
# is cheap (tens of microseconds a row); each transition is a dozen statements
# in its own transaction (its event, the deployment, the lane), measured at
# 14-28 ms on a busy shared two-core machine (docs/reapers.md). A bounded sweep
# thus fits a one-minute tick there; a larger backlog drains over ticks, and a
# tick that cannot start in time expires instead of piling up.
BATCH_SIZE = 200
MAX_ROWS = 2000
# A sweep gives up after this many unexpected errors (the database is likely
# down); each is logged with its traceback, and the next tick starts afresh.
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
        """Rows this sweep changed (everything but ``skipped``, ``error`` and ``flush_failed``)."""
        return sum(n for k, n in self.counts.items() if k not in ("skipped", "error", "flush_failed"))

    def summary(self) -> str:
        outcomes = metrics.REAPER_OUTCOMES[self.reaper]
        parts = [f"{k}={self.counts[k]}" for k in outcomes if self.counts[k] or k not in ("error", "flush_failed")]
        return f"{self.reaper}: {' '.join(parts)} in {self.seconds * 1000:.1f} ms"


# --------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------

# Status lists are literals, never parameters, so each statement provably
# matches its partial index's predicate. Each statement answers (key, id).

# reset expired assignments — index run_lease_expiry_idx
_EXPIRED_ASSIGNMENTS_SQL = """
SELECT assigned_expires_at, id FROM run
WHERE status = 'assigned' AND assigned_expires_at < %(now)s
  AND (assigned_expires_at, id) > (%(after_key)s, %(after_id)s)
ORDER BY assigned_expires_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# startup deadline — index run_never_started_idx. An assigned run qualifies
# only once its lease lapsed: its runner may still be about to accept.
_STARTUP_DEADLINE_SQL = """
SELECT first_pending_at, id FROM run
WHERE status IN ('pending', 'assigned') AND started_at IS NULL
  AND first_pending_at < %(deadline)s
  AND (assigned_expires_at IS NULL OR assigned_expires_at < %(now)s)
  AND (first_pending_at, id) > (%(after_key)s, %(after_id)s)
ORDER BY first_pending_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# cancellation backstop — index run_cancel_backstop_idx (normally empty)
_CANCELLATION_BACKSTOP_SQL = """
SELECT created_at, id FROM run
WHERE status = 'requested_cancellation' AND started_at IS NULL
  AND (assigned_expires_at IS NULL OR assigned_expires_at < %(now)s)
  AND (created_at, id) > (%(after_key)s, %(after_id)s)
ORDER BY created_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# busy runners gone silent — index runner_busy_seen_idx. A busy runner's
# liveness is its last status poll; accept stamps it, so it is never null in
# practice, and the fallbacks only keep a hand-made row from escaping.
_SILENT_RUNNERS_SQL = """
SELECT COALESCE(last_seen_at, accepted_at, created_at), id FROM runner
WHERE status = 'busy' AND COALESCE(last_seen_at, accepted_at, created_at) < %(silent_before)s
  AND (COALESCE(last_seen_at, accepted_at, created_at), id) > (%(after_key)s, %(after_id)s)
ORDER BY COALESCE(last_seen_at, accepted_at, created_at), id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""


def _due(sql: str, params: dict[str, Any], *, batch_size: int, max_rows: int) -> Iterator[uuid.UUID]:
    """The due ids, selected ``batch_size`` at a time in (key, id) order, at most ``max_rows``."""
    (after_key, after_id), taken = _BEFORE_ALL, 0
    while taken < max_rows:
        limit = min(batch_size, max_rows - taken)
        # The locks last only as long as the selection (see the module docstring).
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, {**params, "after_key": after_key, "after_id": after_id, "limit": limit})
            rows = cur.fetchall()
        for _, row_id in rows:
            yield row_id
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

    def attempt(self, transition: Callable[[], Any]) -> tuple[bool, Any]:
        """Run one row's transition; a refusal counts as ``skipped``, a failure as ``error``."""
        counts = self.result.counts
        try:
            return True, transition()
        except GantryError as exc:
            # Another sweep or a request moved the row first: nothing to do.
            log.debug("reaper skipped a row: %s", exc.detail, extra={"event": f"reaper.{self.result.reaper}.skip"})
            counts["skipped"] += 1
        except Exception:
            counts["error"] += 1
            log.exception("reaper step failed", extra={"event": f"reaper.{self.result.reaper}.error"})
            if counts["error"] >= MAX_ERRORS:
                raise
        return False, None

    def step(self, outcome: str, transition: Callable[[], Any]) -> None:
        """Run one row's transition and count ``outcome`` when it happened."""
        if self.attempt(transition)[0]:
            self.result.counts[outcome] += 1


def reset_expired_assignments(*, now: datetime, batch_size: int = BATCH_SIZE, max_rows: int = MAX_ROWS) -> SweepResult:
    """Assigned runs past their lease go back to pending; the lease is cleared, the runner pointer kept.

    Keeping the pointer keeps the run out of dispatch while its runner may still
    boot (One Runner Per Run); the stub reaper or a deregister releases it.
    """
    with _Sweep("expired_assignments", now) as sweep:
        for run_id in _due(_EXPIRED_ASSIGNMENTS_SQL, {"now": now}, batch_size=batch_size, max_rows=max_rows):
            sweep.step("reset", partial(services.run_reset_lease, run_id=run_id, now=now))
    return sweep.result


def startup_deadline(*, now: datetime, batch_size: int = BATCH_SIZE, max_rows: int = MAX_ROWS) -> SweepResult:
    """Runs never started within ``GANTRY_RUNNER_STARTUP_DEADLINE`` of first becoming pending → startup_timeout.

    ``first_pending_at`` survives re-queue cycles, so the deadline counts from
    the run's original eligibility. The deployment fails and the lane moves on.
    """
    deadline = now - timedelta(seconds=conf.get().runner_startup_deadline)
    params = {"now": now, "deadline": deadline}
    with _Sweep("startup_deadline", now) as sweep:
        for run_id in _due(_STARTUP_DEADLINE_SQL, params, batch_size=batch_size, max_rows=max_rows):
            sweep.step("timed_out", partial(services.run_startup_timeout, run_id=run_id, now=now))
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
        for runner_id in _due(_SILENT_RUNNERS_SQL, params, batch_size=batch_size, max_rows=max_rows):
            _reap_silent_runner(sweep, runner_id, silent_before=silent_before, now=now)
    return sweep.result


def _reap_silent_runner(sweep: _Sweep, runner_id: uuid.UUID, *, silent_before: datetime, now: datetime) -> None:
    """Fail the silent runner's run, flush its live log, delete the runner: each step re-done by the next
    sweep if this one stops half-way (the runner stays busy and silent until its row is deleted)."""
    counts = sweep.result.counts
    done, lost = sweep.attempt(
        lambda: services.runner_fail_lost(runner_id=runner_id, silent_before=silent_before, now=now)
    )
    if not done:
        return
    if lost is None:
        counts["skipped"] += 1  # it checked in since the selection, or another sweep has it
        return
    if lost.failed:
        counts["runner_lost"] += 1
    if lost.run_id is not None:
        try:
            flush_live_log_seam(lost.run_id)
        except Exception:
            # The run is failed; the runner row stays, so the next sweep
            # retries the flush before deleting it.
            counts["flush_failed"] += 1
            log.warning(
                "live-log flush failed; retried next sweep",
                exc_info=True,
                extra={"event": "reaper.flush_failed", "run_id": str(lost.run_id), "runner_id": str(runner_id)},
            )
            return
    sweep.step("runner_deleted", lambda: services.runner_deregister(runner_id=runner_id, now=now))


def cancellation_backstop(*, now: datetime, batch_size: int = BATCH_SIZE, max_rows: int = MAX_ROWS) -> SweepResult:
    """Never-started runs stuck in requested_cancellation, lease lapsed → cancelled, lane promoted.

    No service creates this state any more; a run already in it would hold its
    stack's lane for ever (docs/design.md §6: a backstop, not a routine window).
    """
    with _Sweep("cancellation_backstop", now) as sweep:
        for run_id in _due(_CANCELLATION_BACKSTOP_SQL, {"now": now}, batch_size=batch_size, max_rows=max_rows):
            sweep.step("cancelled", partial(services.run_cancel_backstop, run_id=run_id, now=now))
    return sweep.result


# The order ``reap`` runs them in (beat runs each as its own task): the stub
# reaper frees runs whose lease was just reset; the startup deadline then
# sees every run the others left.
REAPERS: dict[str, Callable[..., SweepResult]] = {
    "expired_assignments": reset_expired_assignments,
    "inactive_runners": inactive_runners,
    "startup_deadline": startup_deadline,
    "cancellation_backstop": cancellation_backstop,
}


def reap(*, now: datetime, only: list[str] | None = None) -> list[SweepResult]:
    """Run the named reapers (all by default) once, as of ``now``."""
    return [REAPERS[name](now=now) for name in (only or REAPERS)]


# --------------------------------------------------------------------------
# Force-delete and the live-log seam
# --------------------------------------------------------------------------


def force_delete_runner(*, runner_id: uuid.UUID, by: User | None = None, now: datetime) -> uuid.UUID | None:
    """Force-delete a runner offline past the gate (``services.runner_force_delete``), then flush its run's live log.

    The one entry point of the API and the admin action. The flush is a slow
    side effect (log storage), so it runs after the service's transaction.
    """
    failed = services.runner_force_delete(runner_id=runner_id, by=by, now=now)
    metrics.record_reaped("force_delete", {"runner_deleted": 1, "run_failed": int(failed is not None)})
    if failed is not None:
        try:
            flush_live_log_seam(failed)
        except Exception:
            # Nothing will retry this one (the runner row is gone): say so loudly.
            log.error(
                "live-log flush after force-delete failed",
                exc_info=True,
                extra={"event": "reaper.force_delete.flush_failed", "run_id": str(failed)},
            )
    return failed


def flush_live_log_seam(run_id: uuid.UUID) -> bool:
    """Flush a lost run's live-log record to log storage as its final chunk; False when there is no log store.

    The seam to the log store, ``gantry.logs.flush_live_log`` (the logs work,
    issue 6). Where that module or function is absent this does nothing, and
    the live-log record simply expires on its TTL. The function must be
    idempotent (two racing sweeps may both call it; a call after the record is
    gone does nothing) and may raise on a storage error, in which case the
    sweep keeps the runner row and retries on the next tick.
    """
    try:
        logs = importlib.import_module("gantry.logs")
    except ModuleNotFoundError as exc:
        if exc.name != "gantry.logs":
            raise  # gantry.logs exists but is broken: that is a bug to see
        return False
    flush = getattr(logs, "flush_live_log", None)
    if flush is None:
        return False
    flush(run_id)
    return True
