"""Run priority (issue 25): run.priority, stack.default_priority, and the claim's index ordered by priority.

Both columns are smallint NOT NULL with a database default (normal): adding
them rewrites nothing (a default stored in the catalogue), and the previous
release's inserts, which do not name them, get ``normal``.

The claim's index gains ``priority`` between the selector and the age
(docs/queue.md: one index head per (org, selector, priority)). It is built
CONCURRENTLY before the old one is dropped CONCURRENTLY, so no claim ever
runs without an index and no write waits for the build; hence a
non-atomic migration. While the previous release still serves, its claim
(ORDER BY first_pending_at within a selector) reads the new index in three
priority ranges and sorts at most its selector's pending runs: correct, only
slower at a large backlog, until the replicas are replaced.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

PRIORITIES = [(0, "low"), (1, "normal"), (2, "high")]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("core", "0019_runnergroup_archived_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="priority",
            field=models.SmallIntegerField(choices=PRIORITIES, db_default=1, default=1),
        ),
        migrations.AddField(
            model_name="stack",
            name="default_priority",
            field=models.SmallIntegerField(choices=PRIORITIES, db_default=1, default=1),
        ),
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                condition=models.Q(("assigned_runner__isnull", True), ("status", "pending")),
                fields=["organization", "selector", "priority", "first_pending_at", "id"],
                name="run_claim_order_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="run", name="run_claimable_idx"),
    ]
