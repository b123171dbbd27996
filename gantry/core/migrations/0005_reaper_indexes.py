"""Partial indexes for the failure-window reapers (gantry/reapers/reapers.py).

Every reaper sweep (each minute) selects its due rows with one statement
``WHERE <state> AND <deadline> < now ORDER BY <deadline>, id LIMIT n``. Each
index below holds only the rows in that reaper's state, ordered by its
deadline, so a sweep reads the due rows and stops: its cost follows the due
rows, not the run table, which is mostly finished history and grows for ever
(docs/reapers.md has the measurements). ``id`` completes each key because the
sweeps page through due rows by (deadline, id).

- run_lease_expiry_idx: reset expired assignments. Assigned runs by lease
  expiry; as many rows as runs out on a lease (at most the runner slots).
- run_never_started_idx: startup deadline. Pending and assigned runs by
  first_pending_at. The claim's run_claimable_idx leads with (organization,
  selector), so it cannot answer "oldest across all orgs"; this one can, and a
  pending backlog costs the sweep only its runs past the deadline.
  ``started_at IS NULL`` holds for every row in these states; it is in the
  predicate so the index states exactly what the sweep asks.
- run_cancel_backstop_idx: cancellation backstop. Never-started runs in
  requested_cancellation, a state no service creates any more: normally empty,
  so the backstop costs one empty index probe instead of a table scan.
- runner_stub_created_idx: the stub half of inactive runners. not_ready and
  ready runners by created_at (stubs age from creation; see the reaper).
- runner_busy_seen_idx: the busy half. Busy runners by the last sign of life
  the sweep compares (an expression index: the sweep's ORDER BY and WHERE use
  this exact expression).

The runner table stays small (its rows are the groups' slots in use); its two
indexes are for a sweep that never scans it, and cost little for the same reason.

Built CONCURRENTLY (hence ``atomic = False`` and one statement per operation:
CONCURRENTLY cannot run inside a transaction block), so migrating a live
installation never blocks the claim's writes to run while a million-row index
builds. If a concurrent build fails, PostgreSQL leaves an INVALID index under
the name; the reverse migration (``DROP INDEX CONCURRENTLY IF EXISTS``) removes
it before a retry.
"""

from django.db import migrations

INDEXES = {
    "run_lease_expiry_idx": "ON run (assigned_expires_at, id) WHERE status = 'assigned'",
    "run_never_started_idx": (
        "ON run (first_pending_at, id) WHERE status IN ('pending', 'assigned') AND started_at IS NULL"
    ),
    "run_cancel_backstop_idx": (
        "ON run (created_at, id) WHERE status = 'requested_cancellation' AND started_at IS NULL"
    ),
    "runner_stub_created_idx": "ON runner (created_at, id) WHERE status IN ('not_ready', 'ready')",
    "runner_busy_seen_idx": (
        "ON runner ((COALESCE(last_seen_at, accepted_at, created_at)), id) WHERE status = 'busy'"
    ),
}


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("core", "0004_claimable_notify_triggers")]

    operations = [
        migrations.RunSQL(
            sql=f"CREATE INDEX CONCURRENTLY {name} {definition}",
            reverse_sql=f"DROP INDEX CONCURRENTLY IF EXISTS {name}",
        )
        for name, definition in INDEXES.items()
    ]
