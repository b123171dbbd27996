"""Stack secret values are stored encrypted (gantry/core/secrets.py): encrypt the ones stored in the clear.

Until now ``stack.secrets`` held ``{name: value}`` in plain text. After this
migration it holds ``{name: Fernet token}``; names stay readable. The keys
come from settings (``GANTRY_SECRETS_KEYS``, or the one derived from the
secret key), so set them before migrating a production database. Reversible:
going back decrypts the values again.

Rows are read and written one stack at a time with ``update()`` (no model
``save()``), inside the migration's transaction.
"""

from django.db import migrations


def encrypt(apps, schema_editor):
    from gantry.core import secrets

    Stack = apps.get_model("core", "Stack")
    for stack in Stack.objects.exclude(secrets={}).only("id", "secrets").iterator():
        Stack.objects.filter(id=stack.id).update(secrets=secrets.seal(stack.secrets))


def decrypt(apps, schema_editor):
    from gantry.core import secrets

    Stack = apps.get_model("core", "Stack")
    for stack in Stack.objects.exclude(secrets={}).only("id", "secrets").iterator():
        Stack.objects.filter(id=stack.id).update(secrets=secrets.unseal(stack.secrets))


class Migration(migrations.Migration):
    dependencies = [("core", "0008_runner_claim_counted")]

    operations = [migrations.RunPython(encrypt, decrypt)]
