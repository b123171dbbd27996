"""GET /api/v1/orgs/{org}/dispatch-budget: who may read it, and what it answers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Organization, RunnerGroup
from gantry.dispatch import throttle
from tests.throttle.helpers import RedisProcess, group_api

pytestmark = pytest.mark.django_db

URL = "/api/v1/orgs/acme/dispatch-budget"


def test_it_answers_a_member_with_a_full_bucket_for_a_new_org(teammate_api: APIClient, acme: Organization) -> None:
    response = teammate_api.get(URL)

    assert response.status_code == 200
    assert response.json() == {
        "runs_per_hour_limit": 2,
        "burst": 48,
        "tokens_available": 48,
        "throttled": False,
        "next_slot_at": None,
        "seconds_to_next_slot": 0,
        "dispatch_throttled_until": None,
        "answered_from": "bucket",
    }


def test_reading_it_spends_nothing(teammate_api: APIClient, acme: Organization) -> None:
    for _ in range(3):
        throttle.take(organization_id=acme.id, rate=2)
    first = teammate_api.get(URL).json()
    second = teammate_api.get(URL).json()
    assert first["tokens_available"] == second["tokens_available"] == 45


def test_it_lets_a_super_admin_read_any_org(root_api: APIClient, acme: Organization) -> None:
    assert root_api.get(URL).status_code == 200


def test_it_hides_the_org_from_a_member_of_another(outsider_api: APIClient, acme: Organization) -> None:
    assert outsider_api.get(URL).status_code == 404
    assert outsider_api.get("/api/v1/orgs/nope/dispatch-budget").status_code == 404


def test_it_wants_credentials(anon: APIClient, acme: Organization) -> None:
    assert anon.get(URL).status_code == 401


def test_it_refuses_a_runner_group_token(group: RunnerGroup) -> None:
    assert group_api(group).get(URL).status_code == 403


def test_it_says_never_for_rate_zero(teammate_api: APIClient, acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=0)
    body = teammate_api.get(URL).json()
    assert (body["burst"], body["tokens_available"], body["throttled"]) == (0, 0, True)
    assert (body["next_slot_at"], body["seconds_to_next_slot"]) == (None, None)


def test_it_answers_from_the_stamp_when_redis_is_down(
    teammate_api: APIClient, acme: Organization, own_redis: RedisProcess
) -> None:
    stamp = timezone.now() + timedelta(minutes=10)
    Organization.objects.filter(id=acme.id).update(dispatch_throttled_until=stamp)
    own_redis.kill()

    response = teammate_api.get(URL)

    assert response.status_code == 200
    body = response.json()
    assert body["answered_from"] == "stamp"
    assert body["tokens_available"] is None
    assert body["throttled"] is True
    assert 590 < body["seconds_to_next_slot"] <= 600
    assert body["dispatch_throttled_until"] is not None
    assert body["next_slot_at"] is not None


def test_an_old_stamp_means_not_throttled_when_redis_is_down(
    teammate_api: APIClient, acme: Organization, own_redis: RedisProcess
) -> None:
    Organization.objects.filter(id=acme.id).update(dispatch_throttled_until=timezone.now() - timedelta(minutes=1))
    own_redis.kill()
    body = teammate_api.get(URL).json()
    assert (body["throttled"], body["seconds_to_next_slot"], body["next_slot_at"]) == (False, 0, None)
