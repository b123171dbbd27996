"""stack.archived_at: an archived stack (``DELETE /api/v1/stacks/{id}``, ``services.stack_archive``).

Archiving keeps the row: its deployments and finished runs stay readable, and
runs reference it. The stack leaves the lists and takes no deployment.

The name's uniqueness becomes partial (live stacks only), so an org can make a
new stack under an archived one's name, as it would after deleting it. The
index keeps its name: ``services.tenancy._create_named`` recognises a
concurrent create of the same name by it. Both steps are quick on this small
table (an org's stacks); the column is nullable with no default, so adding it
rewrites nothing. Reversing fails while two stacks of one org share a name (one archived).
"""

from django.db import migrations, models
from django.db.models.functions import Lower


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0017_log_flush"),
    ]

    operations = [
        migrations.AddField(
            model_name="stack",
            name="archived_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RemoveConstraint(model_name="stack", name="stack_org_name_ci_uniq"),
        migrations.AddConstraint(
            model_name="stack",
            constraint=models.UniqueConstraint(
                models.F("organization"),
                Lower("name"),
                condition=models.Q(archived_at__isnull=True),
                name="stack_org_name_ci_uniq",
            ),
        ),
    ]
