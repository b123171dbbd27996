"""Drop four indexes that a wider index already serves.

Each is the leading column (or columns) of another index of its table, so no
query loses its index:

- ``run(deployment_id)`` and ``run(deployment_id, attempt DESC)``: the unique
  (deployment_id, attempt) index serves the foreign key and, scanned
  backwards, the latest attempt;
- ``runner(runner_group_id)``: ``runner_group_status_idx`` (runner_group_id, status);
- ``run_event(run_id)``: ``run_event_run_at_idx`` (run_id, at);
- ``runner_group(organization_id)``: the unique (organization_id, name) index.

Why it matters: the claim writes a run, a runner and a run_event row, and
its update of the run cannot be HOT (``status`` is in partial-index
predicates), so every index of run takes a new entry on every claim
(docs/performance.md).

Only the indexes are dropped. Django's AlterField(db_index=False) would also
drop and re-add each foreign key, re-validating it with a full scan of run
under an exclusive lock; the constraints are fine as they are, so the model
state changes separately from the database.
"""

import django.db.models.deletion
from django.db import migrations, models

_INDEXES = [
    (
        "run_deployment_attempt_idx",
        'CREATE INDEX "run_deployment_attempt_idx" ON "run" ("deployment_id", "attempt" DESC)',
    ),
    ("run_deployment_id_cc8ca106", 'CREATE INDEX "run_deployment_id_cc8ca106" ON "run" ("deployment_id")'),
    ("run_event_run_id_f9e980b1", 'CREATE INDEX "run_event_run_id_f9e980b1" ON "run_event" ("run_id")'),
    (
        "runner_runner_group_id_c719279f",
        'CREATE INDEX "runner_runner_group_id_c719279f" ON "runner" ("runner_group_id")',
    ),
    (
        "runner_group_organization_id_7d6f8512",
        'CREATE INDEX "runner_group_organization_id_7d6f8512" ON "runner_group" ("organization_id")',
    ),
]



def _unindexed_fk(model_name: str, name: str, related_name: str, to: str) -> migrations.AlterField:
    return migrations.AlterField(
        model_name=model_name,
        name=name,
        field=models.ForeignKey(
            db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name=related_name, to=to
        ),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0006_run_log_manifest"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(sql=f'DROP INDEX IF EXISTS "{name}"', reverse_sql=create)
                for name, create in _INDEXES
            ],
            state_operations=[
                migrations.RemoveIndex(model_name="run", name="run_deployment_attempt_idx"),
                _unindexed_fk("run", "deployment", "runs", "core.deployment"),
                _unindexed_fk("runevent", "run", "events", "core.run"),
                _unindexed_fk("runner", "runner_group", "runners", "core.runnergroup"),
                _unindexed_fk("runnergroup", "organization", "runner_groups", "core.organization"),
            ],
        ),
    ]
