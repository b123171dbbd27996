"""log_flush: runs a force-delete failed whose live log has still to reach storage (``core.LogFlush``).

A force-delete fails the run and deletes its runner in one transaction, then
flushes the run's live log to storage. The other paths that fail a run without
its runner keep the runner row until that flush lands, so their reaper retries
it; a force-delete has no row left to retry from, and a flush that failed
(storage down) lost the log when its Redis record expired. The force-delete
now queues the run here in its own transaction; the flush after commit, or the
inactive-runner reaper's next tick, deletes the row once the log is stored.

A plain uuid, not a foreign key (as log_purge): retention deletes runs
set-based, and a row whose run is gone has nothing to flush and is dropped.
No index beyond the key: the table holds only the flushes that failed.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0016_hot_heartbeats"),
    ]

    operations = [
        migrations.CreateModel(
            name="LogFlush",
            fields=[
                ("run_id", models.UUIDField(primary_key=True, serialize=False)),
                ("queued_at", models.DateTimeField()),
            ],
            options={
                "db_table": "log_flush",
                "ordering": ["queued_at"],
            },
        ),
    ]
