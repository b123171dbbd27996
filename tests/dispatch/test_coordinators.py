"""Coordinators identify themselves on the poll (gantry.dispatch.coordinators, docs/protocol.md).

Polls over HTTP with the group's token, against the test PostgreSQL and Redis.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from gantry import redis as gantry_redis
from gantry.core import services, tokens
from gantry.core.models import Organization, RunnerGroup
from gantry.dispatch import coordinators

pytestmark = pytest.mark.django_db

POLL = "/api/v1/runner-groups/poll"
WHO = {
    "HTTP_X_GANTRY_COORDINATOR_ID": "7f3c",
    "HTTP_X_GANTRY_COORDINATOR_HOST": "build-1.example",
    "HTTP_X_GANTRY_COORDINATOR_VERSION": "0.1.0",
}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    coordinators.forget_writes()
    yield
    coordinators.forget_writes()


@pytest.fixture
def linux(acme: Organization) -> Iterator[RunnerGroup]:
    group, _ = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
    gantry_redis.client().delete(coordinators.key_for(group.id))
    yield group
    gantry_redis.client().delete(coordinators.key_for(group.id))


def _coordinator(group: RunnerGroup) -> APIClient:
    client = APIClient()
    token = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _recorded(group: RunnerGroup) -> list[coordinators.Coordinator]:
    found = coordinators.of_groups([group.id])
    assert found is not None
    return found[group.id]


def test_it_records_the_identity_a_poll_sends(linux: RunnerGroup) -> None:
    assert _coordinator(linux).get(POLL, **WHO).status_code == 204

    [seen] = _recorded(linux)
    assert (seen.id, seen.host, seen.version) == ("7f3c", "build-1.example", "0.1.0")


def test_an_old_coordinator_without_headers_still_polls_and_is_recorded_nowhere(linux: RunnerGroup) -> None:
    assert _coordinator(linux).get(POLL).status_code == 204

    assert _recorded(linux) == []
    linux.refresh_from_db()
    assert linux.last_polled_at is not None


def test_a_host_alone_stands_for_the_id(linux: RunnerGroup) -> None:
    assert _coordinator(linux).get(POLL, HTTP_X_GANTRY_COORDINATOR_HOST="old-box").status_code == 204

    assert [(c.id, c.host, c.version) for c in _recorded(linux)] == [("old-box", "old-box", "")]


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("HTTP_X_GANTRY_COORDINATOR_ID", "has space"),
        ("HTTP_X_GANTRY_COORDINATOR_ID", "x" * 65),
        ("HTTP_X_GANTRY_COORDINATOR_HOST", "h" * 256),
        ("HTTP_X_GANTRY_COORDINATOR_VERSION", "v\u00e9"),
    ],
)
def test_a_malformed_identity_is_a_400_and_changes_nothing(linux: RunnerGroup, header: str, value: str) -> None:
    answer = _coordinator(linux).get(POLL, **{**WHO, header: value})

    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"
    assert _recorded(linux) == []
    linux.refresh_from_db()
    assert linux.last_polled_at is None  # no claim ran


def test_it_writes_redis_at_most_every_few_seconds_per_coordinator(linux: RunnerGroup) -> None:
    who = coordinators.Identity(id="a", host="h", version="1")

    assert coordinators.record(group_id=linux.id, who=who) is True
    assert coordinators.record(group_id=linux.id, who=who) is False  # the hot path: no second write
    # A new version (a restart in place) is news at once.
    assert coordinators.record(group_id=linux.id, who=coordinators.Identity(id="a", host="h", version="2")) is True
    assert [c.version for c in _recorded(linux)] == ["2"]


def test_a_group_keeps_its_most_recent_coordinators_only(linux: RunnerGroup) -> None:
    for i in range(coordinators.MAX_PER_GROUP + 5):
        coordinators.record(group_id=linux.id, who=coordinators.Identity(id=f"c{i}", host="h", version=""), now=i)

    kept = _recorded(linux)
    assert len(kept) == coordinators.MAX_PER_GROUP
    assert kept[0].id == f"c{coordinators.MAX_PER_GROUP + 4}"  # most recent first
    assert "c0" not in {c.id for c in kept}


def test_a_token_of_another_group_records_nothing_for_this_one(acme: Organization, linux: RunnerGroup) -> None:
    other, _ = services.runner_group_create(org=acme, name="other", labels={})
    try:
        assert _coordinator(other).get(POLL, **WHO).status_code == 204
        assert _recorded(linux) == []
    finally:
        gantry_redis.client().delete(coordinators.key_for(other.id))
