"""The logs app's configuration."""

from django.apps import AppConfig


class LogsConfig(AppConfig):
    name = "gantry.logs"
    label = "logs"
    verbose_name = "Run logs"
