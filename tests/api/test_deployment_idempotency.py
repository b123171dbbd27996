"""POST /stacks/{id}/deployments with Idempotency-Key: a retried POST queues nothing new (docs/api.md)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Deployment, Organization, Run, Stack, WebhookDelivery, WebhookEndpoint
from tests.conftest import SPEC

KEY = "4f1c7a52-9a7e-4d8e-b2a5-0c55f3a1e9d1"


def post(client: APIClient, stack: Stack, key: str | None, body: dict[str, Any] | None = None) -> Any:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(f"/api/v1/stacks/{stack.id}/deployments", body or {}, format="json", **headers)


@pytest.mark.django_db
class TestIdempotencyKey:
    def test_a_retry_answers_the_first_deployment_and_queues_nothing(
        self, owner_api: APIClient, stack: Stack, acme: Organization
    ) -> None:
        first = post(owner_api, stack, KEY)
        assert first.status_code == 201, first.content
        assert "Idempotent-Replayed" not in first

        again = post(owner_api, stack, KEY)
        assert again.status_code == 201
        assert again["Idempotent-Replayed"] == "true"
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["run"]["id"] == first.json()["run"]["id"]
        assert Deployment.objects.filter(stack=stack).count() == 1
        assert Run.objects.filter(stack=stack).count() == 1

        # Without a key, or with another, each POST is a deployment of its own.
        assert post(owner_api, stack, None).json()["id"] != first.json()["id"]
        assert post(owner_api, stack, KEY + "-2").json()["id"] != first.json()["id"]
        assert Deployment.objects.filter(stack=stack).count() == 3

    def test_the_key_is_the_stacks_own(self, owner_api: APIClient, stack: Stack, acme: Organization) -> None:
        other = services.stack_create(org=acme, name="api", spec=SPEC)
        a, b = post(owner_api, stack, KEY), post(owner_api, other, KEY)
        assert (a.status_code, b.status_code) == (201, 201)
        assert a.json()["id"] != b.json()["id"]
        assert "Idempotent-Replayed" not in b

    def test_the_key_reused_for_another_request_is_422_and_changes_nothing(
        self, owner_api: APIClient, teammate_api: APIClient, stack: Stack
    ) -> None:
        first = post(owner_api, stack, KEY).json()
        other_spec = {"spec": {**SPEC, "steps": [{"name": "bye", "run": "echo bye"}]}}
        for client, body in ((owner_api, other_spec), (teammate_api, None)):  # another spec; another user
            refused = post(client, stack, KEY, body)
            assert refused.status_code == 422, refused.content
            assert refused.json()["code"] == "idempotency_key_reused"
            assert refused.json()["deployment_id"] == first["id"]
        assert Deployment.objects.filter(stack=stack).count() == 1

    @pytest.mark.parametrize("key", ["", "x" * 256, "has space", "ünïcode", "tab\there"])
    def test_a_malformed_key_is_400_and_queues_nothing(self, owner_api: APIClient, stack: Stack, key: str) -> None:
        refused = post(owner_api, stack, key)
        assert refused.status_code == 400, refused.content
        assert refused.json()["code"] == "invalid_request"
        assert not Deployment.objects.exists()

    def test_the_longest_key_is_taken(self, owner_api: APIClient, stack: Stack) -> None:
        key = "k" * 255
        assert post(owner_api, stack, key).status_code == 201
        assert Deployment.objects.get().idempotency_key == key

    def test_a_replay_sends_no_second_webhook(self, owner_api: APIClient, stack: Stack, acme: Organization) -> None:
        # Written directly: the outbox is what counts here, and nothing is sent (no DNS, no sender).
        WebhookEndpoint.objects.create(
            organization=acme, url="https://hooks.example.com/x", events=["run.queued"], secret_sealed="-"
        )
        post(owner_api, stack, KEY)
        post(owner_api, stack, KEY)
        assert list(WebhookDelivery.objects.values_list("event", flat=True)) == ["run.queued"]


@pytest.mark.django_db(transaction=True)
def test_two_retries_racing_make_one_deployment(stack: Stack, owner: User) -> None:
    """The check runs under the stack's lock: of two at once, the second waits and answers the first's."""
    barrier = threading.Barrier(2)
    answers: list[tuple[int, bool]] = []

    def once() -> None:
        try:
            barrier.wait()
            deployment, replayed = services.deployment_create_once(stack=stack, created_by=owner, idempotency_key=KEY)
            answers.append((deployment.id, replayed))
        finally:
            connection.close()

    threads = [threading.Thread(target=once) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 2
    assert {deployment_id for deployment_id, _ in answers} == {Deployment.objects.get(stack=stack).id}
    assert sorted(replayed for _, replayed in answers) == [False, True]
    assert Run.objects.filter(stack=stack).count() == 1
