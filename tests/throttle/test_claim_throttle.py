"""The throttle on the claim (docs/design.md, "Per-org runs/hour throttle").

Polls go over HTTP as a coordinator's would, against the test PostgreSQL and
Redis; nothing of Gantry's is replaced.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from gantry import redis as gantry_redis
from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunStatus
from gantry.dispatch import longpoll, throttle
from gantry.dispatch.claim import Throttled, _stamp_throttled, claim
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.throttle.helpers import (
    RedisProcess,
    backlog,
    bucket_exists,
    dispatches,
    group_api,
    tokens_of,
    wide_group,
)

pytestmark = pytest.mark.django_db

POLL = "/api/v1/runner-groups/poll"


def poll_status(api: APIClient) -> int:
    response = api.get(POLL)
    assert response.status_code in (200, 204), response.content
    return response.status_code


def test_it_dispatches_24_runs_at_1_per_hour_then_throttles_the_25th(
    acme: Organization, root_api: APIClient, teammate_api: APIClient
) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 26)
    group = wide_group(acme)
    coordinator = group_api(group)
    limited_before = dispatches(throttle.LIMITED)

    assert [poll_status(coordinator) for _ in range(24)] == [200] * 24
    before_25th = timezone.now()
    assert poll_status(coordinator) == 204

    # Rolled back: no stub of the 25th claim survives, its run is pending again.
    assert Runner.objects.filter(runner_group=group).count() == 24
    assert Run.objects.filter(organization=acme, status=RunStatus.ASSIGNED).count() == 24
    assert Run.objects.filter(organization=acme, status=RunStatus.PENDING, assigned_runner_id=None).count() == 2
    assert dispatches(throttle.LIMITED) == limited_before + 1
    # The deferral stamp: the next refill, an hour away at 1/h.
    acme.refresh_from_db()
    assert acme.dispatch_throttled_until is not None
    assert before_25th + timedelta(seconds=3500) < acme.dispatch_throttled_until <= timezone.now() + timedelta(hours=1)

    budget = teammate_api.get("/api/v1/orgs/acme/dispatch-budget").json()
    assert budget["runs_per_hour_limit"] == 1
    assert budget["burst"] == 24
    assert budget["tokens_available"] == 0
    assert budget["throttled"] is True
    assert 3500 < budget["seconds_to_next_slot"] <= 3600
    assert budget["next_slot_at"] is not None
    assert budget["answered_from"] == "bucket"

    # The operator's response: raise the rate. The stamp goes in the same write,
    # and the bucket follows the new rate at once (3600/h: a token a second).
    response = root_api.put("/api/v1/orgs/acme/runs-per-hour-limit", {"runs_per_hour_limit": 3600}, format="json")
    assert response.status_code == 200
    assert response.json()["dispatch_throttled_until"] is None
    # At 1/h the next token was an hour away; at 3600/h it is at most a second away. The bound
    # only stops a stuck test: any dispatch before it proves the new rate is the one applied.
    hang_guard = time.monotonic() + 60
    while poll_status(coordinator) != 200:
        assert time.monotonic() < hang_guard, "hang guard: no dispatch 60 s after raising the rate to 3600/h"
        time.sleep(0.05)
    assert Runner.objects.filter(runner_group=group).count() == 25


def test_it_answers_the_poll_with_204_and_stamps_the_org_when_throttled(acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 2)
    group = wide_group(acme)
    for _ in range(24):
        throttle.take(organization_id=acme.id, rate=1)  # spent by earlier dispatches

    assert poll_status(group_api(group)) == 204
    acme.refresh_from_db()
    assert acme.dispatch_throttled_until is not None
    assert acme.dispatch_throttled_until > timezone.now() + timedelta(minutes=59)
    assert not Runner.objects.filter(runner_group=group).exists()


def test_it_answers_a_throttled_long_poll_at_once(acme: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 1)
    group = wide_group(acme)
    for _ in range(24):
        throttle.take(organization_id=acme.id, rate=1)
    parked: list[float] = []  # the timeout of every wait a long poll went into
    wait = longpoll.ClaimableListener.wait

    def recorded(self: longpoll.ClaimableListener, org_id: int, seen: tuple[int, int], timeout: float) -> bool:
        parked.append(timeout)
        return wait(self, org_id, seen, timeout)

    monkeypatch.setattr(longpoll.ClaimableListener, "wait", recorded)
    response = group_api(group).get(POLL + "?wait=20")
    assert response.status_code == 204
    # Not parked until the deadline: the budget, not a lack of work, said no.
    assert parked == []
    assert Run.objects.get(organization=acme).status == RunStatus.PENDING


def test_it_can_raise_throttled_for_a_caller_that_must_tell_it_from_no_work(acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 1)
    group = wide_group(acme)
    for _ in range(24):
        throttle.take(organization_id=acme.id, rate=1)

    with pytest.raises(Throttled) as caught:
        claim(group=group, raise_throttled=True)

    assert caught.value.organization_id == acme.id
    acme.refresh_from_db()
    assert acme.dispatch_throttled_until == caught.value.until  # stamped before raising
    assert Run.objects.get(organization=acme).status == RunStatus.PENDING


def test_a_new_orgs_bucket_starts_full(db: None, teammate_api: APIClient) -> None:
    org = services.org_create(slug="initech", name="Initech")
    assert org.runs_per_hour_limit == 2
    assert tokens_of(org) == 48

    group = wide_group(org)
    backlog(org, 1)
    assert claim(group=group) is not None
    assert 46.99 < tokens_of(org) < 47.01


def test_new_orgs_get_2_per_hour_from_the_column_default_even_by_raw_sql(db: None) -> None:
    with connection.cursor() as cur:
        cur.execute("INSERT INTO organization (slug, name) VALUES ('raw', 'Raw') RETURNING runs_per_hour_limit")
        row = cur.fetchone()
    assert row is not None
    assert row[0] == 2


def test_it_never_asks_redis_when_the_claim_finds_no_run(acme: Organization) -> None:
    group = wide_group(acme)
    assert claim(group=group) is None  # nothing pending
    full = make_group(acme, "full", {"os": "linux"}, max_concurrent_runs=1)
    deploy(make_stack(acme, "x", {"os": "linux"}))
    assert claim(group=full) is not None
    deploy(make_stack(acme, "y", {"os": "linux"}))
    tokens = tokens_of(acme)
    assert claim(group=full) is None  # at capacity: no row won, so no token spent
    assert tokens_of(acme) - tokens < 0.01


def test_a_poll_with_no_work_leaves_no_bucket_behind(acme: Organization) -> None:
    assert poll_status(group_api(wide_group(acme))) == 204
    assert not bucket_exists(acme)


def test_throttling_one_org_never_delays_another(acme: Organization, globex: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 25)
    backlog(globex, 3)
    acme_poller = group_api(wide_group(acme))
    globex_poller = group_api(wide_group(globex))

    assert [poll_status(acme_poller) for _ in range(25)] == [200] * 24 + [204]
    assert [poll_status(globex_poller) for _ in range(3)] == [200] * 3
    assert poll_status(acme_poller) == 204  # still throttled
    assert 44.99 < tokens_of(globex) < 45.01  # 48 - 3: acme's throttle cost globex nothing
    globex.refresh_from_db()
    assert globex.dispatch_throttled_until is None


def test_rate_zero_dispatches_nothing_and_needs_no_redis(acme: Organization, own_redis: RedisProcess) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=0)
    backlog(acme, 1)
    group = wide_group(acme)
    own_redis.kill()  # rate 0 is known without Redis: it must not fail open

    assert claim(group=group) is None
    acme.refresh_from_db()
    assert acme.dispatch_throttled_until is not None  # re-checked within the hour (MAX_STAMP)
    assert acme.dispatch_throttled_until <= timezone.now() + throttle.MAX_STAMP
    assert Run.objects.get(organization=acme).status == RunStatus.PENDING


def test_a_stamp_computed_at_the_old_rate_never_lands_after_a_rate_change(acme: Organization) -> None:
    # A throttled claim read rate 1; before its stamp is written, a super-admin
    # raises the rate (which clears the stamp). The late stamp must not land.
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    late = Throttled(organization_id=acme.id, runs_per_hour_limit=1, until=timezone.now() + timedelta(hours=1))
    services.org_set_runs_per_hour_limit(org=acme, limit=50)

    _stamp_throttled(late)

    acme.refresh_from_db()
    assert acme.dispatch_throttled_until is None


def test_it_counts_dispatches_by_outcome(acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 2)
    group = wide_group(acme)
    for _ in range(23):
        throttle.take(organization_id=acme.id, rate=1)
    dispatched, limited = dispatches(throttle.DISPATCHED), dispatches(throttle.LIMITED)

    assert claim(group=group) is not None
    assert claim(group=group) is None

    assert dispatches(throttle.DISPATCHED) == dispatched + 1
    assert dispatches(throttle.LIMITED) == limited + 1


def test_it_makes_no_redis_call_and_sets_no_limit_when_rate_limiting_is_off(
    acme: Organization, own_redis: RedisProcess, rate_limit_disabled: None, teammate_api: APIClient
) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 30)
    coordinator = group_api(wide_group(acme))
    server = own_redis.client()
    server.config_resetstat()

    assert [poll_status(coordinator) for _ in range(30)] == [200] * 30
    budget = teammate_api.get("/api/v1/orgs/acme/dispatch-budget").json()

    called = {name.removeprefix("cmdstat_") for name in server.info("commandstats")}
    # Only this test's own calls, and the run metrics' counters (gantry.metrics.record_run, its connection's
    # hello and client setinfo included): no throttle call.
    assert not {c for c in called if not c.startswith(("config", "info", "hincrby", "hello", "client"))}, called
    assert budget["answered_from"] == "disabled"
    assert budget["throttled"] is False
    # ...and Gantry's client does point at this server (the silence is not a misdirection).
    assert gantry_redis.client().connection_pool.connection_kwargs["port"] == own_redis.port
