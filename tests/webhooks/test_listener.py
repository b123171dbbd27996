"""The kick: the worker's listener hears the outbox's NOTIFY once a transition that wrote deliveries commits."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.utils import timezone

from gantry.core.models import Organization, Stack, WebhookDelivery
from gantry.webhooks import listener
from gantry.webhooks import services as webhooks
from tests.core.drive import deploy


def wait_for(condition: Any, limit: float = 10.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.mark.django_db(transaction=True)
def test_a_committed_delivery_kicks_the_worker(acme: Organization, stack: Stack, settings: Any) -> None:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    webhooks.endpoint_create(org=acme, url="http://127.0.0.1:9/x", events=["run.queued"], secret="k" * 16)
    kicks: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=listener.listen, args=(lambda: kicks.append(time.monotonic()), stop))
    thread.start()
    try:
        assert wait_for(lambda: len(kicks) == 1)  # the kick on connecting

        deploy(stack, now=timezone.now())  # commits: its delivery row NOTIFYs

        assert wait_for(lambda: len(kicks) == 2)
        assert WebhookDelivery.objects.count() == 1
    finally:
        stop.set()
        thread.join()
