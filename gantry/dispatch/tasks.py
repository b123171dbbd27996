"""The backend dispatcher inside the Celery worker: beat starts ``gantry.dispatch.loop`` every minute.

Each task runs the dispatcher loop (woken by NOTIFY, with its backstop tick)
for just under one period, so the worker always has one running; a second
one overlapping it is safe (see ``gantry.dispatch.dispatcher``). The beat
entry exists only when GitHub credentials are configured. The loop occupies
one worker process for its whole period: give the worker ``--concurrency 2``
or more so the reapers keep theirs, or run ``manage.py dispatcher`` instead
with ``GANTRY_DISPATCH_IN_WORKER=false``.
"""

from __future__ import annotations

import threading

from celery import shared_task

from gantry.dispatch.dispatcher import Dispatcher

# The beat period, and how long each task's loop runs within it.
PERIOD = 60.0
LOOP_SECONDS = PERIOD - 5.0


@shared_task(name="gantry.dispatch.loop", ignore_result=True)
def loop() -> None:
    Dispatcher().run(threading.Event(), seconds=LOOP_SECONDS)
