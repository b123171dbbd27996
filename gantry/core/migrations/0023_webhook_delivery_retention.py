"""Retention of webhook deliveries (gantry/reapers/retention.py): the two indexes its statements read.

- ``webhook_delivery_finished_idx`` (next_attempt_at, id) WHERE status IN
  (delivered, failed): the scan of finished deliveries past the cut-off, oldest
  first, stopping at the batch's end. A finished row's ``next_attempt_at`` is
  its last attempt plus that attempt's backoff (at most an hour), so it is the
  finish's time, never early.
- ``webhook_delivery_run_idx`` (run_id) WHERE status IN (delivered, failed):
  the run's deliveries, deleted in the statement that deletes the run.

Both partial: a delivery enters them once, when it finishes; the inserts of
the transitions and the sender's writes to pending rows add no entry. Built
CONCURRENTLY (``atomic = False``, one statement per operation) like 0010, so a
live installation keeps delivering while they build; an INVALID index left by a
failed build is removed by the reverse.
"""

from django.db import migrations, models

FINISHED = "status IN ('delivered', 'failed')"
FINISHED_IDX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_delivery_finished_idx "
    f"ON webhook_delivery (next_attempt_at, id) WHERE {FINISHED}"
)
RUN_IDX = f"CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_delivery_run_idx ON webhook_delivery (run_id) WHERE {FINISHED}"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("core", "0022_webhooks")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql=FINISHED_IDX, reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS webhook_delivery_finished_idx"
                ),
                migrations.RunSQL(sql=RUN_IDX, reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS webhook_delivery_run_idx"),
            ],
            state_operations=[
                migrations.AddIndex(
                    model_name="webhookdelivery",
                    index=models.Index(
                        condition=models.Q(("status__in", ["delivered", "failed"])),
                        fields=["next_attempt_at", "id"],
                        name="webhook_delivery_finished_idx",
                    ),
                ),
                migrations.AddIndex(
                    model_name="webhookdelivery",
                    index=models.Index(
                        condition=models.Q(("status__in", ["delivered", "failed"])),
                        fields=["run_id"],
                        name="webhook_delivery_run_idx",
                    ),
                ),
            ],
        ),
    ]
