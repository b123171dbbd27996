"""Runner group and stack names are unique within an org whatever their case.

"Linux" and "linux" are one name to a person reading the queue page; two
groups so named made every reason sentence ambiguous. The exact-case unique
constraints become unique indexes on (organization_id, lower(name)); the new
one still leads with organization_id, so it serves the runner group's
organization foreign key as the old one did.

Existing data cannot break it: before the constraints go in, every name that
collides with an older one of its org, ignoring case, is renamed to
``<name>-<id>`` (cut to fit 100 characters), keeping the oldest row (lowest
id) as it was. Ids are unique, so a renamed name never collides again; the
renames are printed for the operator. Groups and stacks are referenced by id
everywhere (tokens, runs, URLs), so a rename breaks no reference. Nothing is
renamed back on reverse: the old constraints accept the new names.

The constraints are added in this migration's transaction: ``ADD CONSTRAINT
… UNIQUE`` on these small tables (an org's groups and stacks) holds its lock
for milliseconds.
"""

from django.db import migrations, models
from django.db.models.functions import Lower

MAX_NAME = 100


def _rename_duplicates(apps, schema_editor):  # type: ignore[no-untyped-def]
    for model_name in ("RunnerGroup", "Stack"):
        model = apps.get_model("core", model_name)
        seen: set[tuple[int, str]] = set()
        for row in model.objects.order_by("organization_id", "id").only("id", "organization_id", "name"):
            key = (row.organization_id, row.name.lower())
            if key not in seen:
                seen.add(key)
                continue
            suffix = f"-{row.id}"
            new = row.name[: MAX_NAME - len(suffix)] + suffix
            print(f"\n  {model_name} {row.id}: renamed {row.name!r} -> {new!r} (a case-insensitive duplicate)")
            model.objects.filter(id=row.id).update(name=new)
            seen.add((row.organization_id, new.lower()))


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0011_invitations"),
    ]

    operations = [
        migrations.RunPython(_rename_duplicates, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="runnergroup", name="runner_group_org_name_uniq"),
        migrations.RemoveConstraint(model_name="stack", name="stack_org_name_uniq"),
        migrations.AddConstraint(
            model_name="runnergroup",
            constraint=models.UniqueConstraint(
                models.F("organization"), Lower("name"), name="runner_group_org_name_ci_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="stack",
            constraint=models.UniqueConstraint(models.F("organization"), Lower("name"), name="stack_org_name_ci_uniq"),
        ),
    ]
