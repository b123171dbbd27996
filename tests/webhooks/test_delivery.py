"""Webhook deliveries: written by the transition's statement, sent signed, retried, in order, never for a rollback."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from gantry.core import secrets, services
from gantry.core.errors import InvalidTransition, WebhookUrlForbidden
from gantry.core.models import (
    WEBHOOK_EVENTS,
    DeliveryStatus,
    Organization,
    RunnerGroup,
    Stack,
    WebhookDelivery,
    WebhookEndpoint,
)
from gantry.core.secrets import SecretUnreadable
from gantry.webhooks import delivery
from gantry.webhooks import services as webhooks
from tests.core.drive import deploy, drive
from tests.webhooks.receiver import Receiver, receiver

SECRET = "s3cret-s3cret-s3cret"


@pytest.fixture
def allow_private(settings: Any) -> None:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True


@pytest.fixture
def hook(allow_private: None) -> Iterator[Receiver]:
    with receiver() as r:
        yield r


def endpoint(org: Organization, url: str, events: list[str] | None = None) -> WebhookEndpoint:
    return webhooks.endpoint_create(org=org, url=url, events=events or list(WEBHOOK_EVENTS), secret=SECRET)


def past() -> datetime:
    # The transitions' own clock, a minute back: what they write is due at once.
    return timezone.now() - timedelta(minutes=1)


def verify(headers: dict[str, str], body: bytes) -> bool:
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers["x-gantry-signature-256"], expected)


def test_each_transition_is_delivered_once_signed(
    acme: Organization, stack: Stack, group: RunnerGroup, hook: Receiver
) -> None:
    endpoint(acme, hook.url)
    d = drive(stack, group, "succeeded", now=past())

    assert delivery.deliver_due() == {"delivered": 4}
    assert delivery.deliver_due() == {}  # nothing twice

    events = [r.headers["x-gantry-event"] for r in hook.requests]
    assert events == ["run.queued", "run.running", "run.succeeded", "deployment.finished"]
    for r in hook.requests:
        assert r.path == "/hook?x=1"
        assert r.headers["content-type"] == "application/json"
        assert verify(r.headers, r.body)
        body = json.loads(r.body)
        assert body["event"] == r.headers["x-gantry-event"]
        assert body["delivery_id"] == r.headers["x-gantry-delivery"]
        assert body["run"]["id"] == str(d.run.id)
        assert body["run"]["stack"] == stack.name
        assert body["run"]["deployment_id"] == d.run.deployment_id
    done = json.loads(hook.requests[2].body)["run"]
    assert done["status"] == "succeeded"
    assert done["exit_code"] == 0
    assert done["priority"] == "normal"
    assert done["timings"]["run_seconds"] == 1.0  # accept at +2 s, finish at +3 s
    assert json.loads(hook.requests[3].body)["deployment"] == {
        "id": d.run.deployment_id,
        "status": "succeeded",
        "stack_id": stack.pk,
    }
    assert not WebhookDelivery.objects.exclude(status=DeliveryStatus.DELIVERED).exists()


def test_an_endpoint_gets_only_its_events_and_another_org_none(
    acme: Organization, globex: Organization, stack: Stack, group: RunnerGroup, hook: Receiver
) -> None:
    endpoint(acme, hook.url, ["run.failure"])
    endpoint(globex, hook.url)
    drive(stack, group, "succeeded", now=past())
    d = drive(stack, group, "failure", now=past())

    delivery.deliver_due()

    assert [json.loads(r.body)["event"] for r in hook.requests] == ["run.failure"]
    assert json.loads(hook.requests[0].body)["run"]["id"] == str(d.run.id)


def test_a_failed_answer_is_retried_with_the_same_body(
    acme: Organization, stack: Stack, group: RunnerGroup, hook: Receiver
) -> None:
    endpoint(acme, hook.url, ["run.queued"])
    deploy(stack, now=past())
    hook.answers = [500]

    assert delivery.deliver_due() == {"pending": 1}
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, 500)
    # The first retry comes within 30 s of the attempt.
    assert row.last_attempt_at is not None
    assert row.last_attempt_at <= timezone.now()
    assert row.next_attempt_at - row.last_attempt_at <= timedelta(seconds=30)
    assert delivery.deliver_due() == {}  # not before it is due

    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    assert delivery.deliver_due() == {"delivered": 1}

    first, second = hook.requests
    assert first.body == second.body
    assert first.headers["x-gantry-delivery"] == second.headers["x-gantry-delivery"]
    assert verify(second.headers, second.body)
    first_attempt = row.last_attempt_at
    row.refresh_from_db()
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 2, 204)
    assert row.last_attempt_at == row.delivered_at
    assert row.last_attempt_at > first_attempt


def test_a_delivery_gives_up_after_a_day(acme: Organization, stack: Stack, hook: Receiver) -> None:
    endpoint(acme, hook.url, ["run.queued"])
    deploy(stack, now=timezone.now() - timedelta(hours=23, minutes=59, seconds=50))
    hook.answers = [503]

    before = timezone.now()
    assert delivery.deliver_due() == {"failed": 1}
    row = WebhookDelivery.objects.get()
    assert row.status == DeliveryStatus.FAILED
    # When it gave up.
    assert row.last_attempt_at is not None
    assert before <= row.last_attempt_at <= timezone.now()


def test_a_runs_later_event_waits_for_the_earlier_one(
    acme: Organization, stack: Stack, group: RunnerGroup, hook: Receiver
) -> None:
    endpoint(acme, hook.url, ["run.queued", "run.running"])
    d = drive(stack, group, "running", now=past())
    hook.answers = [500]

    # run.queued failed: run.running is not sent meanwhile, though it is due.
    assert delivery.deliver_due() == {"pending": 1}
    assert [r.headers["x-gantry-event"] for r in hook.requests] == ["run.queued"]
    assert delivery.deliver_due() == {}

    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    assert delivery.deliver_due() == {"delivered": 2}
    assert [r.headers["x-gantry-event"] for r in hook.requests] == ["run.queued", "run.queued", "run.running"]
    ids = list(WebhookDelivery.objects.filter(run_id=d.run.id).order_by("id").values_list("event", flat=True))
    assert ids == ["run.queued", "run.running"]


def test_a_rolled_back_transition_writes_no_delivery(
    acme: Organization, stack: Stack, group: RunnerGroup, hook: Receiver
) -> None:
    endpoint(acme, hook.url, ["run.succeeded", "run.cancelled"])
    d = drive(stack, group, "running", now=past())

    class Abort(Exception):
        pass

    def finish_then_abort() -> None:
        with transaction.atomic():
            services.run_finish(run_id=d.run.id, outcome="succeeded", exit_code=0, now=timezone.now())
            assert WebhookDelivery.objects.filter(event="run.succeeded").count() == 1  # written in the transition
            raise Abort

    with pytest.raises(Abort):
        finish_then_abort()
    # And a transition its guards refuse writes none either.
    with pytest.raises(InvalidTransition):
        services.run_finish(run_id=d.run.id, outcome="cancelled", exit_code=143, now=timezone.now())

    assert not WebhookDelivery.objects.exists()
    assert delivery.deliver_due() == {}
    assert hook.requests == []


def test_no_endpoint_no_delivery(acme: Organization, stack: Stack, group: RunnerGroup) -> None:
    drive(stack, group, "succeeded", now=past())
    assert not WebhookDelivery.objects.exists()


def test_a_skipped_run_tells_only_its_deployment(
    acme: Organization, stack: Stack, group: RunnerGroup, hook: Receiver
) -> None:
    endpoint(acme, hook.url, ["run.cancelled", "deployment.finished"])
    drive(stack, group, "running", now=past())
    waiting = deploy(stack, now=past())
    services.deployment_skip(deployment_id=waiting.deployment_id, now=timezone.now())

    delivery.deliver_due()

    (only,) = hook.requests
    body = json.loads(only.body)
    assert body["event"] == "deployment.finished"
    assert body["deployment"]["status"] == "skipped"
    assert body["run"]["status"] == "discarded"


def test_a_private_address_is_refused_at_registration_and_at_send(
    acme: Organization, stack: Stack, settings: Any
) -> None:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = False
    for url in ("http://127.0.0.1:9/x", "http://10.1.2.3/x", "http://169.254.169.254/latest", "http://[::1]/x"):
        with pytest.raises(WebhookUrlForbidden):
            endpoint(acme, url)
    assert not WebhookEndpoint.objects.exists()

    # Registered while allowed, then the rule holds at send time: not sent, retried later.
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    endpoint(acme, "http://127.0.0.1:9/x", ["run.queued"])
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = False
    deploy(stack, now=past())
    assert delivery.deliver_due() == {"pending": 1}
    row = WebhookDelivery.objects.get()
    assert "private, loopback or link-local" in row.last_error
    assert row.last_status_code is None


def test_the_signature_is_hmac_sha256_of_the_raw_body() -> None:
    body = b'{"event": "run.queued"}'
    assert delivery.signature("k" * 16, body) == ("sha256=" + hmac.new(b"k" * 16, body, hashlib.sha256).hexdigest())


@pytest.fixture
def keys(settings: Any) -> Iterator[Callable[..., None]]:
    """Set GANTRY_SECRETS_KEYS to the keys given (the first seals); the cached keys are forgotten before and after."""

    def use(*keys: bytes) -> None:
        settings.GANTRY_SECRETS_KEYS = ",".join(k.decode() for k in keys)
        secrets.reset_keys()

    yield use
    secrets.reset_keys()


def test_rotate_secrets_reseals_the_webhook_secret_and_deliveries_still_sign_with_it(
    acme: Organization, stack: Stack, hook: Receiver, keys: Callable[..., None]
) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    keys(old)
    made = endpoint(acme, hook.url, ["run.queued"])

    keys(new, old)
    out = io.StringIO()
    call_command("rotate_secrets", stdout=out)

    assert "1 webhook endpoint(s)" in out.getvalue()
    sealed = WebhookEndpoint.objects.values_list("secret_sealed", flat=True).get(id=made.id)
    assert sealed != made.secret_sealed
    keys(old)
    with pytest.raises(SecretUnreadable):
        webhooks.endpoint_secret(sealed)  # sealed under the new key only

    keys(new)  # the old key dropped: the endpoint still signs
    deploy(stack, now=past())
    assert delivery.deliver_due() == {"delivered": 1}
    (request,) = hook.requests
    assert verify(request.headers, request.body)
