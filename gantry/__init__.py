# The Celery app is loaded with Django, so shared tasks bind to it
# (Celery's documented Django layout).
from gantry.celery import app as celery_app

__all__ = ("celery_app",)
