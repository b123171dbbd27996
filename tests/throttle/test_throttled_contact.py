"""A throttled org's polls count as contact (issue 24: the false "silent" alarm).

A poll the throttle answers 204 rolls its claim back, and with it the claim's
``last_polled_at`` stamp: the groups page then called a coordinator that polls
every second "silent". The throttled path stamps the group itself, at most
every THROTTLED_CONTACT_SECONDS (the poll is the hot path).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gantry.core import services
from gantry.core.models import Organization, RunnerGroup
from gantry.dispatch import throttle
from gantry.dispatch.claim import THROTTLED_CONTACT_SECONDS, Throttled, _stamp_throttled, claim
from tests.throttle.helpers import backlog, group_api, wide_group

pytestmark = pytest.mark.django_db

POLL = "/api/v1/runner-groups/poll"


def _polled_long_ago(group: RunnerGroup) -> None:
    RunnerGroup.objects.filter(id=group.id).update(last_polled_at=timezone.now() - timedelta(seconds=74))


def _last_polled(group: RunnerGroup) -> object:
    return RunnerGroup.objects.values_list("last_polled_at", flat=True).get(id=group.id)


def test_it_stamps_a_poll_that_the_rate_zero_throttle_answers(acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=0)
    backlog(acme, 1)
    group = wide_group(acme)
    _polled_long_ago(group)
    before = timezone.now()

    response = group_api(group).get(POLL)

    assert response.status_code == 204
    stamp = _last_polled(group)
    assert stamp is not None
    assert stamp >= before


def test_it_stamps_a_poll_refused_because_the_budget_is_spent(acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    backlog(acme, 1)
    group = wide_group(acme)
    for _ in range(throttle.burst_for(1)):
        throttle.take(organization_id=acme.id, rate=1)
    _polled_long_ago(group)
    before = timezone.now()

    assert group_api(group).get(POLL).status_code == 204

    stamp = _last_polled(group)
    assert stamp is not None
    assert stamp >= before


def test_it_writes_the_group_at_most_every_few_seconds_while_throttled(acme: Organization) -> None:
    # The hot path stays cheap: a throttled poll soon after the last stamp leaves the row alone.
    services.org_set_runs_per_hour_limit(org=acme, limit=0)
    backlog(acme, 1)
    group = wide_group(acme)
    recent = timezone.now() - timedelta(seconds=THROTTLED_CONTACT_SECONDS - 2)
    RunnerGroup.objects.filter(id=group.id).update(last_polled_at=recent)

    assert claim(group=group) is None

    assert _last_polled(group) == recent


def test_the_groups_page_calls_a_throttled_coordinator_online(acme: Organization, owner: User) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=0)
    backlog(acme, 1)
    group = wide_group(acme)
    _polled_long_ago(group)

    assert group_api(group).get(POLL).status_code == 204

    browser = Client()
    browser.force_login(owner)
    page = browser.get("/orgs/acme/runner-groups")
    assert page.status_code == 200
    assert b"coordinator online" in page.content
    assert b"silent for" not in page.content


def test_the_contact_stamp_rides_in_the_throttle_stamps_one_statement(acme: Organization) -> None:
    # No extra round trip on the throttled path: one UPDATE statement, as before the fix.
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    group = wide_group(acme)
    _polled_long_ago(group)
    late = Throttled(organization_id=acme.id, runs_per_hour_limit=1, until=timezone.now() + timedelta(hours=1))

    with CaptureQueriesContext(connection) as seen:
        _stamp_throttled(late, group_id=group.id)

    assert len([q for q in seen.captured_queries if "UPDATE" in q["sql"]]) == 1
    acme.refresh_from_db()
    assert acme.dispatch_throttled_until == late.until
    assert _last_polled(group) > timezone.now() - timedelta(seconds=5)
