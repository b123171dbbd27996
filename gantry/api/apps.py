"""The API app's configuration."""

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "gantry.api"
    label = "api"
