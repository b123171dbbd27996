"""``python manage.py dispatcher``: the backend dispatcher as a long-running process (docs/github-actions.md)."""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand

from gantry.dispatch.dispatcher import Dispatcher, stop_on_signals


class Command(BaseCommand):
    help = (
        "Dispatch github_actions groups' runs until SIGTERM: a tick whenever a run may have become dispatchable "
        "(the NOTIFY that wakes long polls) and every GANTRY_DISPATCH_INTERVAL seconds. Two at once are safe."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        stop_on_signals(stop)
        self.stdout.write("dispatcher started")
        Dispatcher().run(stop)
        self.stdout.write("dispatcher stopped")
