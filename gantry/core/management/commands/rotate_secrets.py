"""``manage.py rotate_secrets``: re-encrypt every stack secret under the first of GANTRY_SECRETS_KEYS.

Put the new key first in GANTRY_SECRETS_KEYS (keep the old ones after it),
run this, then drop the old keys. Each stack is rewritten in its own short
transaction, locked, so a concurrent change of its secrets is never lost.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from gantry.core import secrets
from gantry.core.models import Stack


class Command(BaseCommand):
    help = "Re-encrypt every stack secret under the first key of GANTRY_SECRETS_KEYS."

    def handle(self, *args: Any, **options: Any) -> None:
        rotated = 0
        for stack_id in Stack.objects.exclude(secrets={}).values_list("id", flat=True).iterator():
            with transaction.atomic():
                stack = Stack.objects.select_for_update().only("id", "secrets").get(id=stack_id)
                Stack.objects.filter(id=stack.id).update(secrets=secrets.rotate(stack.secrets))
            rotated += 1
        self.stdout.write(f"re-encrypted the secrets of {rotated} stack(s)")
