"""Webhooks (issue 26): an org's endpoints and the delivery outbox the run effects write (docs/webhooks.md).

Two new tables, so nothing existing is rewritten. A row trigger on the outbox
NOTIFYs ``gantry_webhooks`` (gantry.webhooks.listener): PostgreSQL delivers a
NOTIFY only when its transaction commits, and folds a transaction's identical
ones into one, so the Celery worker is kicked once per committed transition
that wrote deliveries, never for a rolled-back one, and a transition that
wrote none (an org without endpoints) costs no NOTIFY at all.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0021_run_phases"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="WebhookEndpoint",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("url", models.URLField(max_length=2000)),
                ("events", models.JSONField(default=list)),
                ("secret_sealed", models.TextField()),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL
                    ),
                ),
                (
                    "organization",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="webhooks", to="core.organization"
                    ),
                ),
            ],
            options={
                "db_table": "webhook_endpoint",
                "ordering": ["organization_id", "id"],
            },
        ),
        migrations.CreateModel(
            name="WebhookDelivery",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("run_id", models.UUIDField()),
                ("event", models.CharField(max_length=32)),
                ("body", models.TextField()),
                ("delivery_id", models.UUIDField(unique=True)),
                (
                    "status",
                    models.CharField(
                        choices=[("pending", "Pending"), ("delivered", "Delivered"), ("failed", "Failed")],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("attempts", models.PositiveIntegerField(db_default=0, default=0)),
                ("next_attempt_at", models.DateTimeField()),
                ("last_status_code", models.IntegerField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, db_default="", default="")),
                ("created_at", models.DateTimeField()),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                (
                    "endpoint",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries",
                        to="core.webhookendpoint",
                    ),
                ),
            ],
            options={
                "db_table": "webhook_delivery",
                "ordering": ["id"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("status", "pending")),
                        fields=["next_attempt_at", "id"],
                        name="webhook_delivery_due_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status", "pending")),
                        fields=["endpoint", "run_id", "id"],
                        name="webhook_delivery_order_idx",
                    ),
                    models.Index(fields=["endpoint", "-id"], name="webhook_delivery_recent_idx"),
                ],
            },
        ),
        migrations.RunSQL(
            """
CREATE FUNCTION webhook_delivery_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gantry_webhooks', '');
    RETURN NULL;
END $$;
CREATE TRIGGER webhook_delivery_on_insert AFTER INSERT ON webhook_delivery
    FOR EACH ROW EXECUTE FUNCTION webhook_delivery_notify();
""",
            reverse_sql="""
DROP TRIGGER webhook_delivery_on_insert ON webhook_delivery;
DROP FUNCTION webhook_delivery_notify();
""",
        ),
    ]
