from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0005_reaper_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="log_manifest",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
    ]
