"""Indexes for the queue read and the runs list; the organization foreign key's own index goes.

- ``run_waiting_idx`` (organization_id, status, created_at, id) WHERE status IN
  (queued, pending, assigned): ``GET /orgs/{org}/queue`` reads an org's waiting
  runs oldest first as one index range per status, merged in order (Merge
  Append), and stops at the page's end; ``/metrics`` counts each status with a
  capped range scan. Finished runs never enter it, so its size follows the
  backlog, not the history.
- ``run_org_created_idx`` (organization_id, created_at, id): ``GET /orgs/{org}/runs``
  newest first, keyset-paginated. Its leading column serves the organization
  foreign key, so the plain ``run(organization_id)`` index is dropped: the run
  table keeps as many full indexes as before.

Cost: the claim's update of a run is never HOT (``status`` is in partial-index
predicates), so ``run_waiting_idx`` takes one more entry per claim (pending →
assigned stays inside its predicate) and per run created; accept and every
terminal transition leave the predicate, adding nothing.

Built CONCURRENTLY (``atomic = False``, one statement per operation), so a live
installation keeps claiming while they build; an INVALID index left by a failed
build is removed by the reverse (``DROP INDEX CONCURRENTLY IF EXISTS``). The
model state changes separately: Django's AlterField(db_index=False) would also
drop and re-create the foreign key constraint, re-validating it under a lock.
"""

import django.db.models.deletion
from django.db import migrations, models

WAITING_IDX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS run_waiting_idx ON run (organization_id, status, created_at, id) "
    "WHERE status IN ('assigned', 'pending', 'queued')"
)
ORG_CREATED_IDX = "CREATE INDEX CONCURRENTLY IF NOT EXISTS run_org_created_idx ON run (organization_id, created_at, id)"
FK_IDX = "run_organization_id_e71be01d"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("core", "0009_stack_secrets_encrypted"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(sql=WAITING_IDX, reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS run_waiting_idx"),
                migrations.RunSQL(
                    sql=ORG_CREATED_IDX, reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS run_org_created_idx"
                ),
                # Only once its replacement exists.
                migrations.RunSQL(
                    sql=f'DROP INDEX CONCURRENTLY IF EXISTS "{FK_IDX}"',
                    reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{FK_IDX}" ON run (organization_id)',
                ),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="run",
                    name="organization",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="runs",
                        to="core.organization",
                    ),
                ),
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(
                        condition=models.Q(("status__in", ["assigned", "pending", "queued"])),
                        fields=["organization", "status", "created_at", "id"],
                        name="run_waiting_idx",
                    ),
                ),
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(fields=["organization", "created_at", "id"], name="run_org_created_idx"),
                ),
            ],
        ),
    ]
