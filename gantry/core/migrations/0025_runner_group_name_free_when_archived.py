"""An archived runner group's name is free again (issue 24's leftover): the name's uniqueness becomes partial.

``DELETE /runner-groups/{id}`` archives a group and keeps its row (its runs
reference it and stay readable), so until now its name stayed taken for ever.
Like a stack's since 0018, the unique (organization, lower(name)) index now
covers live groups only (``archived_at IS NULL``), so an org can make a new
group under an archived one's name. The index keeps its name:
``services.tenancy._create_named`` recognises a concurrent create of the same
name by it. Both steps are quick on this small table (an org's groups), and
the narrower index refuses nothing the old one allowed, so the previous
release runs on it unchanged. Reversing fails while two groups of one org
share a name (one archived).
"""

from django.db import migrations, models
from django.db.models.functions import Lower


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0024_webhook_delivery_last_attempt"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="runnergroup", name="runner_group_org_name_ci_uniq"),
        migrations.AddConstraint(
            model_name="runnergroup",
            constraint=models.UniqueConstraint(
                models.F("organization"),
                Lower("name"),
                condition=models.Q(archived_at__isnull=True),
                name="runner_group_org_name_ci_uniq",
            ),
        ),
    ]
