"""The failure-window reapers' SQL (gantry.reapers.reapers, gantry.reapers.stubs): their selections and deletes.

The run edges a sweep takes are gantry.sql.runs' (:func:`~gantry.sql.runs.move_batch`);
what is here selects the due rows and deletes runner rows. Status lists are
literals, never parameters, so each statement provably matches its partial
index's predicate (migration core/0005); where an index's predicate is one
status, the statement writes that one status too. Sent by Django's cursor,
``%(name)s`` parameters.
"""

from __future__ import annotations

from gantry.core.models import RUNNER_NOT_ACCEPTED, RunnerStatus, RunStatus
from gantry.sql import literals
from gantry.sql.runners import holds_run
from gantry.sql.runs import LEASE_LAPSED, STARTUP_TIMEOUT

# ---------------------------------------------------------------- selection
#
# Each answers (key, id) of the next due rows after (%(after_key)s, %(after_id)s),
# in (key, id) order, at most %(limit)s: gantry.reapers.reapers._due pages on.
# A single status is written as one literal, as its index's predicate is; the
# startup deadline's are the STARTUP_TIMEOUT edge's own.

# reset expired assignments — index run_lease_expiry_idx (WHERE status = 'assigned')
EXPIRED_ASSIGNMENTS = f"""
SELECT assigned_expires_at, id FROM run
WHERE status = '{RunStatus.ASSIGNED}' AND assigned_expires_at < %(now)s
  AND (assigned_expires_at, id) > (%(after_key)s, %(after_id)s)
ORDER BY assigned_expires_at, id
LIMIT %(limit)s
"""

# startup deadline — index run_never_started_idx. An assigned run qualifies
# only once its lease lapsed: its runner may still be about to accept.
STARTUP_DEADLINE = f"""
SELECT first_pending_at, id FROM run
WHERE status IN ({literals(STARTUP_TIMEOUT.expected)}) AND started_at IS NULL
  AND first_pending_at < %(deadline)s
  AND {LEASE_LAPSED}
  AND (first_pending_at, id) > (%(after_key)s, %(after_id)s)
ORDER BY first_pending_at, id
LIMIT %(limit)s
"""

# cancellation backstop — index run_cancel_backstop_idx (WHERE status =
# 'requested_cancellation' AND started_at IS NULL; normally empty)
CANCELLATION_BACKSTOP = f"""
SELECT created_at, id FROM run
WHERE status = '{RunStatus.REQUESTED_CANCELLATION}' AND started_at IS NULL
  AND {LEASE_LAPSED}
  AND (created_at, id) > (%(after_key)s, %(after_id)s)
ORDER BY created_at, id
LIMIT %(limit)s
"""

# A busy runner's liveness is its last status poll; accept stamps it, so it is
# never null in practice, and the fallbacks only keep a hand-made row from
# escaping. The selection, its order and the batch's re-check read the same.
_SEEN = "COALESCE(last_seen_at, accepted_at, created_at)"
_BUSY = f"'{RunnerStatus.BUSY}'"

# busy runners gone silent — a pass over the runner table, which holds only
# the live fleet (no index on last_seen_at: every /status moves it, and an
# index would keep each heartbeat from being a HOT update; migration 0016).
SILENT_RUNNERS = f"""
SELECT {_SEEN}, id FROM runner
WHERE status = {_BUSY} AND {_SEEN} < %(silent_before)s
  AND ({_SEEN}, id) > (%(after_key)s, %(after_id)s)
ORDER BY {_SEEN}, id
LIMIT %(limit)s
"""

# ---------------------------------------------------------------- silent runners: the batch

# The batch's runners locked, each re-checked as still busy and silent on its
# latest row version: a /status that refreshed last_seen_at since the selection
# proves the runner alive, and one arriving now waits for this transaction and
# then reads its run's new status (failure). SKIP LOCKED: a runner another
# sweep is reaping is that sweep's. Runners are locked before stacks and runs,
# the per-row path's order (``services.runner_fail_lost``).
LOCK_SILENT = f"""
SELECT id, {_SEEN} FROM runner
WHERE id = ANY(%(ids)s::uuid[]) AND status = {_BUSY}
  AND {_SEEN} < %(silent_before)s
ORDER BY id
FOR UPDATE SKIP LOCKED
"""

# The run each runner accepted (a runner accepts one run in its life), on the
# assigned_runner_id index: executing, or finished without a deregister.
ACCEPTED_RUNS = """
SELECT DISTINCT ON (assigned_runner_id) assigned_runner_id, id, status FROM run
WHERE assigned_runner_id = ANY(%(runners)s::uuid[]) AND started_at IS NOT NULL
ORDER BY assigned_runner_id, started_at DESC
"""

# Deregister's own statement (``services.runner_deregister``) for a batch.
DELETE_RUNNERS = f"DELETE FROM runner r WHERE r.id = ANY(%(ids)s::uuid[]) AND NOT {holds_run('r.id')} RETURNING r.id"

# ---------------------------------------------------------------- stubs (gantry.reapers.stubs)

# The stub reaper's statement, one batch at a time. A stub (never accepted)
# past the cutoff can no longer accept: its claim's lease started when the
# stub was created, and GANTRY_STUB_CUTOFF is longer than the lease
# (conf.check). Its "NOT holds a run" is deregister's own test, so a
# stub is kept whatever the settings while it could still accept, or while a
# never-started run stuck in requested_cancellation points at it (the
# cancellation backstop frees that run first). The ON DELETE SET NULL foreign
# key releases each deleted stub's run for dispatch, and the runner trigger
# NOTIFYs its org (migration 0004).
#
# The candidates are taken first, oldest first, straight off
# runner_stub_created_idx (its predicate: the statuses, as literals), and only
# then tested: written as one filtered SELECT … LIMIT, the planner reads every
# due stub (or every runner) to sort them before the LIMIT, so a sweep would
# cost its due stubs squared. The answer lists every candidate, deleted or
# kept, so the caller pages on by (created_at, id) past kept ones.
DELETE_STUBS = f"""
WITH candidate AS MATERIALIZED (
    SELECT id, created_at FROM runner
    WHERE status IN ({literals(RUNNER_NOT_ACCEPTED)}) AND accepted_at IS NULL AND created_at < %(created_before)s
      AND (created_at, id) > (%(after_key)s, %(after_id)s)
    ORDER BY created_at, id
    LIMIT %(limit)s
    -- A stub some request is changing right now (ready, deregister) is left
    -- for the next sweep rather than waited on.
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM runner r USING candidate c
    WHERE r.id = c.id AND NOT {holds_run("r.id")}
    RETURNING r.id
)
SELECT c.created_at, c.id, d.id IS NOT NULL FROM candidate c LEFT JOIN deleted d ON d.id = c.id
ORDER BY c.created_at, c.id
"""

# ---------------------------------------------------------------- queued flushes (LogFlush)

# The runs whose live-log flush a force-delete queued (and that failed), oldest first, %s at most.
QUEUED_FLUSHES = "SELECT run_id FROM log_flush ORDER BY queued_at, run_id LIMIT %s"
# Their rows, once flushed (or with nothing left to flush).
DELETE_FLUSHES = "DELETE FROM log_flush WHERE run_id = ANY(%s::uuid[])"
