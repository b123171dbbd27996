"""The web app's configuration."""

from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "gantry.web"
    label = "web"
