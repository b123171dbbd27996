from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "gantry.dispatch"
    label = "dispatch"
