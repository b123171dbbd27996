"""What the backend dispatcher records about a github_actions runner (docs/github-actions.md).

When GitHub accepted the workflow dispatch, the workflow run"s URL and the
workflow file dispatched, the sha256 of the one-time correlation input (only
where GitHub answered no run id), and when the runner"s one OIDC exchange
happened (a replay is refused). ``workflow_run_id`` exists already.

Each column is nullable or has a database default: adding them is a catalog
change, no table rewrite, and the claim"s INSERT (which names only the stub"s
own columns) keeps working.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("core", "0012_names_ci_unique"),
    ]

    operations = [
        migrations.AddField(
            model_name="runner",
            name="dispatch_correlation_sha256",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
        migrations.AddField(
            model_name="runner",
            name="dispatched_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runner",
            name="oidc_exchanged_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runner",
            name="workflow_path",
            field=models.CharField(blank=True, db_default="", default="", max_length=300),
        ),
        migrations.AddField(
            model_name="runner",
            name="workflow_run_url",
            field=models.CharField(blank=True, db_default="", default="", max_length=500),
        ),
    ]
