"""Retention (gantry/reapers/retention.py): the scan's index and the log-purge outbox.

- run_finished_idx: finished runs by (finished_at, id), the retention scan's
  keyset. Partial on ``finished_at IS NOT NULL`` so live runs are never in it:
  the claim's writes (finished_at stays null) add no entry to it. Built
  CONCURRENTLY like 0005's indexes, so migrating a live installation never
  blocks writes to run while a million-row index builds.
- log_purge: runs deleted by retention whose log objects and Redis records are
  still to be removed (``core.LogPurge``).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("core", "0013_github_runner_dispatch")]

    operations = [
        migrations.CreateModel(
            name="LogPurge",
            fields=[
                ("run_id", models.UUIDField(primary_key=True, serialize=False)),
                ("queued_at", models.DateTimeField()),
            ],
            options={"db_table": "log_purge", "ordering": ["queued_at"]},
        ),
        migrations.RunSQL(
            sql="CREATE INDEX CONCURRENTLY run_finished_idx ON run (finished_at, id) WHERE finished_at IS NOT NULL",
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS run_finished_idx",
        ),
    ]
