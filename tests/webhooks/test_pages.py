"""The webhooks page over HTTP (Django's test client): admins add, see deliveries and delete; others are refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from gantry.core.models import Organization, Stack, WebhookDelivery, WebhookEndpoint
from gantry.webhooks import delivery
from tests.core.drive import deploy
from tests.webhooks.receiver import Receiver, receiver

PAGE = "/orgs/acme/webhooks"


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def hook(settings: Any) -> Iterator[Receiver]:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    with receiver() as r:
        yield r


def test_an_admin_adds_an_endpoint_and_sees_its_deliveries(
    owner: User, acme: Organization, stack: Stack, hook: Receiver
) -> None:
    page = browser(owner)
    assert 'href="/orgs/acme/webhooks"' in page.get("/orgs/acme/members").content.decode()  # in the nav

    added = page.post(
        f"{PAGE}/add", {"url": hook.url, "events": ["run.queued", "run.running"], "secret": "x" * 20}, follow=True
    )
    assert added.status_code == 200
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.events == ["run.queued", "run.running"]
    run = deploy(stack, now=timezone.now())
    hook.answers = [502]
    delivery.deliver_due()

    html = page.get(PAGE).content.decode()
    assert hook.url.replace("&", "&amp;") in html
    assert "run.queued" in html
    assert f'href="/runs/{run.id}"' in html
    assert "<td data-status>pending</td>" in html
    assert "502" in html
    row = WebhookDelivery.objects.get()
    # The last attempt's time, and when the next one is due.
    last_attempt = re.search(
        r"<td data-last-attempt><time datetime=\"([^\"]+)\">.*?next try <time datetime=\"([^\"]+)\"", html
    )
    assert last_attempt is not None
    assert last_attempt.groups() == (row.last_attempt_at.isoformat(), row.next_attempt_at.isoformat())
    assert "x" * 20 not in html  # the secret is never shown

    page.post(f"{PAGE}/{endpoint.pk}/delete")
    assert not WebhookEndpoint.objects.exists()


def test_a_refused_add_says_why_and_stores_nothing(owner: User, acme: Organization, settings: Any) -> None:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = False
    answer = browser(owner).post(
        f"{PAGE}/add", {"url": "http://10.0.0.1/x", "events": ["run.queued"], "secret": "x" * 20}, follow=True
    )
    assert "private, loopback or link-local" in answer.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_members_get_403_and_outsiders_404(
    owner: User, teammate: User, outsider: User, acme: Organization, hook: Receiver
) -> None:
    browser(owner).post(f"{PAGE}/add", {"url": hook.url, "events": ["run.queued"], "secret": "x" * 20})
    pk = WebhookEndpoint.objects.get().pk

    member = browser(teammate)
    assert member.get(PAGE).status_code == 403
    assert 'href="/orgs/acme/webhooks"' not in member.get("/orgs/acme/members").content.decode()
    assert member.post(f"{PAGE}/{pk}/delete").status_code == 403
    assert (
        member.post(f"{PAGE}/add", {"url": hook.url, "events": ["run.queued"], "secret": "y" * 20}).status_code == 403
    )
    assert browser(outsider).get(PAGE).status_code == 404
    assert browser(outsider).post(f"{PAGE}/{pk}/delete").status_code == 404
    assert WebhookEndpoint.objects.count() == 1
