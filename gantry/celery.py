"""The Celery app: ``celery -A gantry worker`` and ``celery -A gantry beat`` (README, "Background work").

Configuration is Django's settings under the ``CELERY_`` prefix (the broker is
Redis, ``CELERY_BROKER_URL``; the schedule is ``CELERY_BEAT_SCHEDULE``), and
tasks are found in each installed app's ``tasks`` module.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gantry.settings")

app = Celery("gantry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
