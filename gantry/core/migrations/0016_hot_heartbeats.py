"""A runner's heartbeat becomes a HOT update, and run tokens lose an index nobody reads.

- ``runner_busy_seen_idx`` (migration 0005) indexed busy runners by
  ``COALESCE(last_seen_at, ...)``. Every ``/status`` (each running run, every
  few seconds: a fleet's steady load) moves ``last_seen_at``, so with the
  index no heartbeat could be a heap-only (HOT) update: each one wrote a new
  entry into all three of the runner table's other indexes as well, and its
  WAL. Without it a heartbeat changes no indexed column and stays on its page
  (PostgreSQL per /status 0.31 → 0.27 ms in the lifecycle bench). The silent-
  runner sweep now reads the runner table, which holds only the live fleet (a
  runner row goes at deregister): one pass over at most a few thousand rows
  per batch, against an index write on every heartbeat. The sweep's guards
  are unchanged (gantry/reapers/reapers.py).
- ``runner`` keeps a fifth of each page free (fillfactor 80) for those HOT
  versions, so a page filled by inserts still has room for the next heartbeat
  of its rows (new pages only; the table is small and turns over with the
  fleet).
- ``run_token_token_sha256_..._like``: Django gives every unique CharField a
  ``varchar_pattern_ops`` index for LIKE lookups. A token digest is only ever
  looked up by equality (the unique index answers that); the pattern index was
  one more insert on every accept.

``DROP INDEX CONCURRENTLY`` (hence ``atomic = False``, one statement per
operation) so a live installation's writes are never blocked. The reverse
builds both again, CONCURRENTLY too.
"""

from django.db import migrations

LIKE_INDEX = "run_token_token_sha256_97d6f12c_like"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("core", "0015_release_slots_per_statement")]

    operations = [
        migrations.RunSQL(
            sql="DROP INDEX CONCURRENTLY IF EXISTS runner_busy_seen_idx",
            reverse_sql=(
                "CREATE INDEX CONCURRENTLY runner_busy_seen_idx "
                "ON runner ((COALESCE(last_seen_at, accepted_at, created_at)), id) WHERE status = 'busy'"
            ),
        ),
        migrations.RunSQL(
            sql="ALTER TABLE runner SET (fillfactor = 80)",
            reverse_sql="ALTER TABLE runner RESET (fillfactor)",
        ),
        migrations.RunSQL(
            sql=f"DROP INDEX CONCURRENTLY IF EXISTS {LIKE_INDEX}",
            reverse_sql=(
                f"CREATE INDEX CONCURRENTLY {LIKE_INDEX} ON run_token (token_sha256 varchar_pattern_ops)"
            ),
        ),
    ]
