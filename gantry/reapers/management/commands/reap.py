"""``python manage.py reap [--only NAME] [--now ISO-8601]``: run the failure-window reapers once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from gantry.reapers import reapers


def parse_now(value: str) -> datetime:
    """An ISO-8601 instant; one without an offset is taken as UTC (Gantry's time zone)."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(
            f"--now {value!r} is not an ISO-8601 date and time; write e.g. 2030-01-01T12:00:00Z"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Run the failure-window reapers once, as Celery beat does every GANTRY_REAPER_INTERVAL seconds. "
        "Safe to run beside beat: a row another sweep takes is counted as skipped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        names = ", ".join(reapers.REAPERS)
        parser.add_argument(
            "--only",
            action="append",
            metavar="NAME",
            help=f"run only this reaper (repeatable): {names}",
        )
        parser.add_argument(
            "--now",
            metavar="ISO-8601",
            help="judge every deadline as of this instant instead of the clock (no offset: UTC)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        only: list[str] | None = options["only"]
        unknown = [name for name in only or [] if name not in reapers.REAPERS]
        if unknown:
            raise CommandError(
                f"unknown reaper {', '.join(map(repr, unknown))}; choose from: {', '.join(reapers.REAPERS)}"
            )
        now = parse_now(options["now"]) if options["now"] else timezone.now()
        self.stdout.write(f"reaping as of {now.isoformat()}")
        for result in reapers.reap(now=now, only=only):
            self.stdout.write(result.summary())
