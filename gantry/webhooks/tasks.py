"""The Celery task that sends due webhook deliveries: kicked after each commit that wrote some, and by beat.

The kick is :mod:`gantry.webhooks.listener` (the outbox's NOTIFY, heard in the
worker); beat's ``webhooks-deliver`` tick (settings) is the backstop for a lost
kick and what sends retries as they fall due. Overlapping runs are safe: each
claims its own rows.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready

from gantry.core.errors import DATABASE_UNAVAILABLE
from gantry.webhooks import delivery, listener

log = logging.getLogger(__name__)

DELIVER = "gantry.webhooks.deliver"


@shared_task(name=DELIVER, ignore_result=True)
def deliver() -> dict[str, int]:
    try:
        return delivery.deliver_due()
    except DATABASE_UNAVAILABLE as exc:
        # Restarting or unreachable: the rows this run claimed stay leased and are sent once the
        # lease ends (at least once); the next kick or beat tick carries on. One line, no traceback.
        log.warning("webhook deliveries paused, the database is not answering: %r", exc,
                    extra={"event": "webhooks.database_unavailable"})  # fmt: skip
        return {}


@worker_ready.connect
def _listen(**_: object) -> None:
    # In the worker's main process: every NOTIFY queues one deliver task for the pool.
    listener.start(lambda: deliver.delay())
