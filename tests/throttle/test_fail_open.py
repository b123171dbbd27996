"""The throttle fails open: with its Redis gone, runs still dispatch (counted and logged), and nothing errors.

The Redis here is a real ``redis-server`` process the test starts, kills and
restarts; ``settings.REDIS_URL`` points at it for the test.
"""

from __future__ import annotations

import logging
import time

import pytest
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Organization, Run, RunStatus
from gantry.dispatch import throttle
from gantry.dispatch.claim import claim
from tests.throttle.helpers import RedisProcess, backlog, dispatches, fail_opens, group_api, wide_group

pytestmark = pytest.mark.django_db


def test_it_dispatches_while_redis_is_down_and_counts_it(
    acme: Organization, own_redis: RedisProcess, caplog: pytest.LogCaptureFixture, teammate_api: APIClient
) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 5)
    group = wide_group(acme)
    coordinator = group_api(group)
    assert coordinator.get("/api/v1/runner-groups/poll").status_code == 200
    assert own_redis.client().exists(throttle.key_for(acme.id))  # the bucket lives on this server

    own_redis.kill()
    opened, failed_open = fail_opens(), dispatches(throttle.FAILED_OPEN)
    with caplog.at_level(logging.WARNING, logger="gantry.throttle"):
        answers = [coordinator.get("/api/v1/runner-groups/poll").status_code for _ in range(3)]

    assert answers == [200, 200, 200]
    assert Run.objects.filter(organization=acme, status=RunStatus.ASSIGNED).count() == 4
    assert fail_opens() == opened + 3
    assert dispatches(throttle.FAILED_OPEN) == failed_open + 3
    warnings = [r for r in caplog.records if getattr(r, "event", None) == "throttle.fail_open"]
    assert len(warnings) == 1  # one per outage window (the breaker): the later polls did not ask Redis
    assert warnings[0].levelno == logging.WARNING
    assert warnings[0].organization_id == acme.id  # type: ignore[attr-defined]
    # Refused, not timed out: a dead Redis costs the poll no connect or read timeout.
    assert warnings[0].error.startswith("ConnectionError:"), warnings[0].error  # type: ignore[attr-defined]

    # The budget still answers, from what the database knows.
    budget = teammate_api.get("/api/v1/orgs/acme/dispatch-budget")
    assert budget.status_code == 200
    assert budget.json()["answered_from"] == "stamp"
    assert budget.json()["tokens_available"] is None
    assert budget.json()["throttled"] is False  # no stamp: nothing known to hold the org back


def test_it_uses_the_bucket_again_once_redis_is_back(acme: Organization, own_redis: RedisProcess) -> None:
    backlog(acme, 30)
    group = wide_group(acme)
    own_redis.kill()
    assert claim(group=group) is not None  # failed open

    own_redis.start()  # same port; a fresh server that has never seen the script
    # Within BREAKER_SECONDS of the failure the limiter leaves Redis alone; then it asks again.
    # A hang guard, not the property: 20 claims at most, and the backlog has 29 more.
    guard = throttle.BREAKER_SECONDS + 10
    deadline = time.monotonic() + guard
    while not own_redis.client().exists(throttle.key_for(acme.id)):
        assert time.monotonic() < deadline, f"hang guard: the limiter had not gone back to Redis after {guard:g} s"
        assert claim(group=group) is not None  # failing open meanwhile (the breaker is still open)
        time.sleep(0.5)
    tokens = throttle.peek(organization_id=acme.id, rate=2).tokens
    assert 46.99 < tokens < 47.01  # a new server's bucket: full, minus the one claim it saw


def test_it_fails_open_on_a_script_error(acme: Organization, own_redis: RedisProcess) -> None:
    backlog(acme, 1)
    # A key of the wrong type: HMGET on it is a script error, not a connection error.
    own_redis.client().set(throttle.key_for(acme.id), "not a hash")
    opened = fail_opens()

    assert claim(group=wide_group(acme)) is not None

    assert fail_opens() == opened + 1
