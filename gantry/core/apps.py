"""The core app's configuration."""

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "gantry.core"
    label = "core"
    verbose_name = "Gantry"

    def ready(self) -> None:
        from gantry.core import pool_check

        # The pool's checkout check without a round trip per request (pool_check's docstring).
        pool_check.connect_signal()
