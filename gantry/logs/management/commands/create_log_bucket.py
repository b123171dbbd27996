"""``python manage.py create_log_bucket``: create the S3 bucket for sealed log chunks when it is missing."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gantry.logs import storage


class Command(BaseCommand):
    help = (
        "Create the bucket GANTRY_S3_BUCKET names (at GANTRY_S3_ENDPOINT_URL, in GANTRY_S3_REGION) when it is "
        "missing; an existing bucket is left as it is. docker-compose.yml's createbucket service runs it."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        bucket: str = settings.GANTRY_S3_BUCKET
        if not bucket:
            raise CommandError("GANTRY_S3_BUCKET is not set: sealed logs go to a local folder, no bucket to create")
        try:
            created = storage.create_bucket()
        except (BotoCoreError, ClientError) as exc:
            # One line naming the bucket: the usual causes (endpoint down, wrong keys) say themselves.
            raise CommandError(f"could not create the log bucket {bucket!r}: {exc}") from None
        self.stdout.write(f"log bucket {bucket!r} {'created' if created else 'exists'}")
