"""The kick: the worker's listener hears the outbox's NOTIFY once a transition that wrote deliveries commits."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from gantry.core.models import Organization, Stack, WebhookDelivery
from gantry.webhooks import listener, tasks
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


@pytest.mark.django_db(transaction=True)
def test_the_deliver_task_says_one_line_when_the_database_goes_away(
    acme: Organization, stack: Stack, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL restarting under the task (the chaos run saw it): a warning, no traceback; the row goes later."""
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    webhooks.endpoint_create(org=acme, url="http://127.0.0.1:9/x", events=["run.queued"], secret="k" * 16)
    deploy(stack, now=timezone.now())
    # The task's own session terminated, as a restart does: its next statement fails.
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    with psycopg.connect(listener._dsn(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])

    with caplog.at_level(logging.WARNING, logger="gantry.webhooks.tasks"):
        assert tasks.deliver() == {}
    (record,) = [r for r in caplog.records if r.name == "gantry.webhooks.tasks"]
    assert record.event == "webhooks.database_unavailable"  # type: ignore[attr-defined]
    assert record.exc_info is None

    connection.close()  # what Celery does after a task whose connection broke
    assert WebhookDelivery.objects.get().status == "pending"  # nothing lost: it is sent by a later run
