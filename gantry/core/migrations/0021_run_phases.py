"""run.first_claimed_at and run.first_output_at: a run's phases (issue 26).

Two nullable columns, no default: adding them rewrites nothing and takes the
table's lock only for the catalogue change; the previous release's writes
leave them null, which every reader takes as "not known". No index: they are
read with their run, never searched.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0020_priority"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="first_claimed_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="first_output_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
