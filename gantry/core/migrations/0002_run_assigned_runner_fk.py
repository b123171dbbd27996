"""Database-level rules the ORM cannot express.

1. run.assigned_runner_id → runner ON DELETE SET NULL. The binding between a
   runner and its run lives only in this column; when a runner row goes away
   (deregister, reaper, force-delete, or a set-based DELETE that bypasses the
   ORM) the database releases the pointer. Nothing has to remember to clear it.
   Django 5.2 cannot declare a database-side ON DELETE, so the model says
   db_constraint=False and the constraint is created here.
2. The run table is a hot queue: rows move through pending/assigned quickly,
   so vacuum it far more eagerly than the default (20% of the table) or dead
   tuples pile up under the claim's partial index.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("core", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql=(
                "ALTER TABLE run ADD CONSTRAINT run_assigned_runner_fk FOREIGN KEY (assigned_runner_id) "
                "REFERENCES runner (id) ON DELETE SET NULL"
            ),
            reverse_sql="ALTER TABLE run DROP CONSTRAINT run_assigned_runner_fk",
        ),
        migrations.RunSQL(
            sql=(
                "ALTER TABLE run SET (autovacuum_vacuum_scale_factor = 0.01, "
                "autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0)"
            ),
            reverse_sql=(
                "ALTER TABLE run RESET (autovacuum_vacuum_scale_factor, "
                "autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay)"
            ),
        ),
    ]
