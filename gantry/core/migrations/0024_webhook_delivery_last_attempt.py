"""webhook_delivery.last_attempt_at: when a delivery's last attempt ended (issue 26's leftover).

A failed delivery had no finish time: its ``next_attempt_at`` is the last
attempt plus a backoff that never comes. One nullable column, no default:
adding it rewrites nothing and takes the table's lock only for the catalogue
change. The previous release's sender leaves it null, and rows finished before
this migration keep it null (a delivered one still has ``delivered_at``); the
API and the page show null as "not known". No index: it is read with its row.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0023_webhook_delivery_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdelivery",
            name="last_attempt_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
