"""``manage.py webhooks --deliver-once``: send whatever webhook deliveries are due now, by hand."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gantry.webhooks import delivery


class Command(BaseCommand):
    help = "Send the webhook deliveries that are due (operators and tests; the Celery worker does it otherwise)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--deliver-once",
            action="store_true",
            help="send every delivery due now (rounds until none is), print the counts by outcome as JSON",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["deliver_once"]:
            raise CommandError("nothing to do: pass --deliver-once")
        counts = delivery.deliver_due()
        self.stdout.write(json.dumps({"delivered": 0, "pending": 0, "failed": 0, **counts}, sort_keys=True))
