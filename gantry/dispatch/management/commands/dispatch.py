"""``python manage.py dispatch --once``: one backend-dispatcher tick for github_actions groups, then exit."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gantry.dispatch.dispatcher import Dispatcher


class Command(BaseCommand):
    help = (
        "Run one tick of the backend dispatcher (github_actions groups): claim and dispatch what the candidate "
        "query offers, cancel workflow runs whose runner can no longer accept, fail runs whose workflow run ended "
        "without done. Safe beside a running dispatcher. The long-running loop is `manage.py dispatcher`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one tick and exit (required)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["once"]:
            raise CommandError("say --once (one tick); `manage.py dispatcher` runs the long-running loop")
        dispatcher = Dispatcher()
        result = dispatcher.tick()
        self.stdout.write(result.summary())
        if dispatcher.deferred:
            # This process ends here: those claims lapse with their lease and the runs are dispatched again.
            self.stdout.write(f"{dispatcher.deferred} launch(es) deferred by GitHub; their claims will lapse")
