"""The Celery task that sends due webhook deliveries: kicked after each commit that wrote some, and by beat.

The kick is :mod:`gantry.webhooks.listener` (the outbox's NOTIFY, heard in the
worker); beat's ``webhooks-deliver`` tick (settings) is the backstop for a lost
kick and what sends retries as they fall due. Overlapping runs are safe: each
claims its own rows.
"""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready

from gantry.webhooks import delivery, listener

DELIVER = "gantry.webhooks.deliver"


@shared_task(name=DELIVER, ignore_result=True)
def deliver() -> dict[str, int]:
    return delivery.deliver_due()


@worker_ready.connect
def _listen(**_: object) -> None:
    # In the worker's main process: every NOTIFY queues one deliver task for the pool.
    listener.start(lambda: deliver.delay())
