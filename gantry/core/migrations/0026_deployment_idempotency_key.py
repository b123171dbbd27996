"""deployment.idempotency_key: a retried deployment POST queues nothing new (issue 23's leftover).

A POST that a load balancer retries after the web process committed it and
died queued twice. The client now sends ``Idempotency-Key``; the deployment
keeps it, and a retry with the same key answers the deployment the first one
made (gantry.core.services.deployments.deployment_create_once).

- The column is nullable with no default: adding it rewrites nothing, and the
  previous release's inserts leave it null.
- ``deployment_idempotency_uniq`` (stack_id, idempotency_key) WHERE
  idempotency_key IS NOT NULL: the lookup of a retry and the backstop behind the
  stack-lock check. Partial, so unkeyed deployments (every existing row, every
  row the previous release writes) are not in it and it refuses none of them.
  Built CONCURRENTLY (``atomic = False``, one statement per operation) like
  0010 and 0023, so a live installation keeps deploying while it builds; an
  INVALID index left by a failed build is removed by the reverse.
"""

from django.db import migrations, models

UNIQ = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS deployment_idempotency_uniq "
    "ON deployment (stack_id, idempotency_key) WHERE idempotency_key IS NOT NULL"
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("core", "0025_runner_group_name_free_when_archived")]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="idempotency_key",
            field=models.CharField(blank=True, editable=False, max_length=255, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(sql=UNIQ, reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS deployment_idempotency_uniq"),
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="deployment",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("stack", "idempotency_key"),
                        name="deployment_idempotency_uniq",
                    ),
                ),
            ],
        ),
    ]
