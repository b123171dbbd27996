"""The reapers app's configuration."""

from django.apps import AppConfig


class ReapersConfig(AppConfig):
    name = "gantry.reapers"
    label = "reapers"
    verbose_name = "Failure-window reapers"

    def ready(self) -> None:
        # Every Django process (web, worker, commands) serves the reapers'
        # figures, which live in Redis, at /metrics.
        from gantry import metrics

        metrics.register()
