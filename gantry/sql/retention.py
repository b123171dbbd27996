"""The retention reaper's SQL (gantry.reapers.retention): the scan, the batch's delete, the log-purge outbox
and the webhook deliveries' delete.

Sent by Django's cursor, ``%(name)s`` or ``%s`` parameters.
"""

from __future__ import annotations

from gantry.core.models import DELIVERY_FINISHED, TERMINAL
from gantry.sql import literals
from gantry.sql.runs import newer_attempt

# The next finished runs after (%(after_key)s, %(after_id)s) in (finished_at,
# id) order, straight off run_finished_idx (migration 0014).
SCAN = """
SELECT finished_at, id FROM run
WHERE finished_at IS NOT NULL AND finished_at < %(cutoff)s
  AND (finished_at, id) > (%(after_key)s, %(after_id)s)
ORDER BY finished_at, id
LIMIT %(limit)s
"""

# One batch: of the scanned ids, the terminal runs past the cut-off that are
# not their deployment's newest attempt are locked (SKIP LOCKED: nothing else
# should hold a finished run, and if something does it waits for the next
# pass) and deleted with their events, token and finished webhook deliveries
# (webhook_delivery_run_idx, migration 0023; a pending one finishes its tries
# and goes with DELETE_DELIVERIES); the outbox gets the ones that may have
# stored chunks or live records (those that ever started).
DELETE = f"""
WITH doomed AS (
    SELECT run.id, run.started_at FROM run
    WHERE run.id = ANY(%(ids)s::uuid[]) AND run.status IN ({literals(TERMINAL)})
      AND run.finished_at < %(cutoff)s
      -- never a deployment's newest run: the deployment follows it
      AND {newer_attempt("run")}
    FOR UPDATE OF run SKIP LOCKED
),
events AS (DELETE FROM run_event WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
tokens AS (DELETE FROM run_token WHERE run_id IN (SELECT id FROM doomed)),
deliveries AS (
    DELETE FROM webhook_delivery
    WHERE run_id IN (SELECT id FROM doomed) AND status IN ({literals(DELIVERY_FINISHED)})
    RETURNING 1
),
purge AS (
    INSERT INTO log_purge (run_id, queued_at)
    SELECT id, %(now)s FROM doomed WHERE started_at IS NOT NULL
    ON CONFLICT (run_id) DO NOTHING
),
gone AS (DELETE FROM run WHERE id IN (SELECT id FROM doomed) RETURNING id)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries)
"""

# The outbox: runs whose stored chunks and Redis records are still to delete,
# oldest first, %s at most; then their rows, once deleted.
QUEUED_PURGES = "SELECT run_id FROM log_purge ORDER BY queued_at, run_id LIMIT %s"
DELETE_PURGES = "DELETE FROM log_purge WHERE run_id = ANY(%s::uuid[])"

# Webhook deliveries finished before the cut-off, whatever became of their run
# (a deployment's newest run is kept, its deliveries are not), oldest first
# off webhook_delivery_finished_idx (migration 0023), %(limit)s at most. A
# finished row's next_attempt_at is its last attempt plus that attempt's
# backoff (gantry.webhooks.delivery.record, at most an hour): never before it
# finished, so no row goes early. Every row selected is deleted, so no cursor:
# the next batch starts at the oldest left.
DELETE_DELIVERIES = f"""
WITH doomed AS (
    SELECT id FROM webhook_delivery
    WHERE status IN ({literals(DELIVERY_FINISHED)}) AND next_attempt_at < %(cutoff)s
    ORDER BY next_attempt_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM webhook_delivery WHERE id IN (SELECT id FROM doomed)
"""
