"""runner_group.archived_at: a group archived by DELETE /runner-groups/{id} (issue 24).

A nullable column, no default: adding it rewrites nothing and takes the
table's lock only for the catalogue change. No index: every reader filters a
handful of an org's groups, already found by the org (the unique
(organization, lower(name)) index).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0018_stack_archived_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="runnergroup",
            name="archived_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
