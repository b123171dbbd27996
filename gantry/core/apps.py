"""The core app's configuration."""

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "gantry.core"
    label = "core"
    verbose_name = "Gantry"
