"""The webhook API: admins register, list, read deliveries and delete; members 403, other orgs 404, bad input 400."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from gantry.core.models import Organization, Stack, WebhookDelivery, WebhookEndpoint
from tests.core.drive import deploy
from tests.webhooks.receiver import Receiver, receiver

SECRET = "0123456789abcdef"
URL = "/api/v1/orgs/acme/webhooks"


@pytest.fixture
def hook(settings: Any) -> Iterator[Receiver]:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    with receiver() as r:
        yield r


def body(url: str, **more: Any) -> dict[str, Any]:
    return {"url": url, "events": ["run.queued", "deployment.finished"], "secret": SECRET, **more}


def test_an_admin_registers_lists_and_deletes(owner_api: APIClient, hook: Receiver) -> None:
    created = owner_api.post(URL, body(hook.url), format="json")
    assert created.status_code == 201, created.content
    answer = created.json()
    assert answer["url"] == hook.url
    assert answer["events"] == ["run.queued", "deployment.finished"]
    assert "secret" not in answer
    stored = WebhookEndpoint.objects.get()
    assert SECRET not in stored.secret_sealed  # sealed at rest

    listed = owner_api.get(URL)
    assert listed.status_code == 200
    assert [e["id"] for e in listed.json()] == [answer["id"]]
    assert "secret" not in json.dumps(listed.json())

    assert owner_api.delete(f"/api/v1/webhooks/{answer['id']}").status_code == 204
    assert not WebhookEndpoint.objects.exists()
    assert owner_api.delete(f"/api/v1/webhooks/{answer['id']}").status_code == 404


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"url": "ftp://example.com/x"}, "invalid_request"),
        ({"url": "not a url"}, "invalid_request"),
        ({"url": 5}, "invalid_request"),
        ({"events": []}, "invalid_request"),
        ({"events": ["run.exploded"]}, "invalid_request"),
        ({"events": "run.queued"}, "invalid_request"),
        ({"secret": "short"}, "invalid_request"),
        ({"secret": None}, "invalid_request"),
    ],
)
def test_bad_input_is_400_and_stores_nothing(
    owner_api: APIClient, hook: Receiver, change: dict[str, Any], code: str
) -> None:
    answer = owner_api.post(URL, {**body(hook.url), **change}, format="json")
    assert answer.status_code == 400
    assert answer.json()["code"] == code
    assert not WebhookEndpoint.objects.exists()


def test_a_private_url_is_400_webhook_url_forbidden(owner_api: APIClient, settings: Any) -> None:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = False
    answer = owner_api.post(URL, body("http://127.0.0.1:8080/hook"), format="json")
    assert answer.status_code == 400
    assert answer.json()["code"] == "webhook_url_forbidden"
    assert not WebhookEndpoint.objects.exists()


def test_members_are_403_and_other_orgs_404(
    owner_api: APIClient, teammate_api: APIClient, outsider_api: APIClient, hook: Receiver
) -> None:
    pk = owner_api.post(URL, body(hook.url), format="json").json()["id"]

    assert teammate_api.post(URL, body(hook.url), format="json").status_code == 403
    assert teammate_api.get(URL).status_code == 403
    assert teammate_api.delete(f"/api/v1/webhooks/{pk}").status_code == 403
    assert teammate_api.get(f"/api/v1/webhooks/{pk}/deliveries").status_code == 403
    assert outsider_api.get(URL).status_code == 404
    assert outsider_api.delete(f"/api/v1/webhooks/{pk}").status_code == 404
    assert outsider_api.get(f"/api/v1/webhooks/{pk}/deliveries").status_code == 404
    assert WebhookEndpoint.objects.filter(pk=pk).exists()


def test_the_deliveries_route_and_the_command(
    owner_api: APIClient, acme: Organization, stack: Stack, hook: Receiver
) -> None:
    pk = owner_api.post(URL, body(hook.url), format="json").json()["id"]
    deploy(stack, now=timezone.now())
    (pending,) = owner_api.get(f"/api/v1/webhooks/{pk}/deliveries").json()
    assert pending["status"] == "pending"
    assert pending["next_attempt_at"] is not None
    assert pending["last_attempt_at"] is None  # not tried yet

    out = io.StringIO()
    call_command("webhooks", "--deliver-once", stdout=out)
    assert json.loads(out.getvalue()) == {"delivered": 1, "failed": 0, "pending": 0}
    assert [r.headers["x-gantry-event"] for r in hook.requests] == ["run.queued"]

    (row,) = owner_api.get(f"/api/v1/webhooks/{pk}/deliveries").json()
    delivered = WebhookDelivery.objects.get()
    assert row["delivery_id"] == str(delivered.delivery_id)
    assert (row["event"], row["status"], row["attempts"], row["last_status_code"]) == (
        "run.queued",
        "delivered",
        1,
        204,
    )
    # Finished: no next attempt; the last one is when it was delivered.
    assert row["next_attempt_at"] is None
    assert row["last_attempt_at"] is not None
    assert row["last_attempt_at"] == row["delivered_at"]
