"""``manage.py rotate_secrets``: re-encrypt every stack and webhook secret under the first of GANTRY_SECRETS_KEYS.

Put the new key first in GANTRY_SECRETS_KEYS (keep the old ones after it),
run this, then drop the old keys. Each stack, and each webhook endpoint, is
rewritten in its own short transaction, locked, so a concurrent change of its
secrets is never lost and a deleted endpoint is skipped. Running it twice is
harmless: a value already under the first key is simply sealed again.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from gantry.core import secrets
from gantry.core.models import Stack, WebhookEndpoint


class Command(BaseCommand):
    help = "Re-encrypt every stack secret and webhook secret under the first key of GANTRY_SECRETS_KEYS."

    def handle(self, *args: Any, **options: Any) -> None:
        stacks = 0
        for stack_id in Stack.objects.exclude(secrets={}).values_list("id", flat=True).iterator():
            with transaction.atomic():
                stack = Stack.objects.select_for_update().only("id", "secrets").get(id=stack_id)
                Stack.objects.filter(id=stack.id).update(secrets=secrets.rotate(stack.secrets))
            stacks += 1
        endpoints = 0
        for endpoint_id in WebhookEndpoint.objects.values_list("id", flat=True).iterator():
            with transaction.atomic():
                sealed = (
                    WebhookEndpoint.objects.select_for_update()
                    .filter(id=endpoint_id)
                    .values_list("secret_sealed", flat=True)
                    .first()
                )
                if sealed is None:
                    continue  # deleted since the list was read
                WebhookEndpoint.objects.filter(id=endpoint_id).update(secret_sealed=secrets.rotate_token(sealed))
            endpoints += 1
        self.stdout.write(f"re-encrypted the secrets of {stacks} stack(s) and {endpoints} webhook endpoint(s)")
