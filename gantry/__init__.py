"""Gantry: the Django project (settings, urls, the Celery app) and its apps; see docs/design.md §1."""

# The Celery app is loaded with Django, so shared tasks bind to it
# (Celery's documented Django layout).
from gantry.celery import app as celery_app

__all__ = ("celery_app",)
