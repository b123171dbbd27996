"""The dispatcher and the per-org budget and cap (docs/design.md, "Per-org runs/hour throttle", "Cross-org fairness").

Claims are counted two ways: the dispatcher's own per-org attempts
(``TickResult.claims``) and ``gantry_org_run_dispatch_total{outcome}``,
which counts every claim that won a run by what the budget said.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunStatus
from gantry.dispatch import candidates, throttle
from gantry.dispatch.dispatcher import Dispatcher
from gantry.sql import dispatcher as dispatcher_sql
from tests.github.conftest import gha_group, pending_runs
from tests.github.fakes import FakeGitHub
from tests.throttle.helpers import dispatches


def in_flight(org: Organization) -> int:
    return Runner.objects.filter(runner_group__organization=org).count()


def spend_budget(org: Organization, rate: int, *, leave: int = 0) -> None:
    """The org at ``rate`` per hour with only ``leave`` tokens left of its burst (rate * 24)."""
    services.org_set_runs_per_hour_limit(org=org, limit=rate)
    for _ in range(rate * throttle.BURST_HOURS - leave):
        assert throttle.take(organization_id=org.id, rate=rate).allowed


@pytest.mark.django_db
def test_a_throttled_org_costs_one_claim_per_tick_is_deferred_and_comes_back_when_its_rate_is_raised(
    acme: Organization, globex: Organization, github: FakeGitHub, clean_buckets: None
) -> None:
    gha_group(acme)
    gha_group(globex, name="g-actions")
    pending_runs(acme, 5)
    pending_runs(globex, 2, prefix="g")
    spend_budget(acme, 1)
    services.org_set_runs_per_hour_limit(org=globex, limit=1000)
    limited, dispatched = dispatches("limited"), dispatches("dispatched")
    now = timezone.now()

    first = Dispatcher().tick(now)

    # One throttled claim for acme, then it is left alone for the tick; globex is not held up.
    assert first.claims[acme.id] == 1
    assert first.throttled_orgs == {acme.id}
    assert dispatches("limited") == limited + 1
    assert dispatches("dispatched") == dispatched + 2
    assert in_flight(acme) == 0
    assert in_flight(globex) == 2
    acme.refresh_from_db()
    assert acme.dispatch_throttled_until is not None
    assert acme.dispatch_throttled_until > now
    assert Run.objects.filter(organization=acme, status=RunStatus.PENDING).count() == 5  # rolled back

    second = Dispatcher().tick(now + timedelta(seconds=1))

    assert second.candidates == 0  # deferred: not even a candidate
    assert second.claims[acme.id] == 0
    assert dispatches("limited") == limited + 1

    # The operator raises the rate: the stamp goes in the same write, and the
    # bucket refills at the new rate (1000 a second) at once.
    services.org_set_runs_per_hour_limit(org=acme, limit=3_600_000)
    third = Dispatcher().tick()

    assert third.launched >= 1
    assert in_flight(acme) >= 1


@pytest.mark.django_db
def test_a_heavy_org_dispatches_its_cap_and_yields(
    acme: Organization, globex: Organization, github: FakeGitHub, clean_buckets: None
) -> None:
    for org in (acme, globex):
        services.org_set_runs_per_hour_limit(org=org, limit=100_000)
    Organization.objects.filter(id=acme.id).update(max_in_flight=5)
    gha_group(acme)
    gha_group(globex, name="g-actions")
    long_ago = timezone.now() - timedelta(hours=1)
    pending_runs(acme, 200, now=long_ago)  # all older than globex's
    pending_runs(globex, 3, prefix="g")
    # A batch far smaller than acme's backlog: without the per-org cap in the
    # candidate query, acme's 200 older runs would fill every batch.
    dispatcher = Dispatcher(batch_size=20)

    first = dispatcher.tick()

    assert in_flight(globex) == 3  # all of B's runs in the first tick
    assert in_flight(acme) == 5
    assert first.candidates == 8
    for _ in range(3):
        again = dispatcher.tick()
        assert again.claims[acme.id] == 0  # at its cap: not a candidate
        assert in_flight(acme) == 5
    # One of acme's runs finishes and its runner goes away: exactly one more.
    done = Run.objects.filter(organization=acme, status=RunStatus.ASSIGNED).first()
    assert done is not None
    assert done.assigned_runner_id is not None
    services.run_accept(run_id=done.id, runner_id=done.assigned_runner_id)
    services.run_finish(run_id=done.id, runner_id=done.assigned_runner_id, outcome="succeeded", exit_code=0)
    services.runner_deregister(runner_id=done.assigned_runner_id)
    assert in_flight(acme) == 4
    dispatcher.tick()
    assert in_flight(acme) == 5
    assert len(github.dispatches) == 3 + 5 + 1


@pytest.mark.django_db
def test_the_cap_defaults_to_gantry_dispatch_max_per_org(
    acme: Organization, github: FakeGitHub, clean_buckets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from gantry import conf

    capped = dataclasses.replace(conf.get(), dispatch_max_per_org=2)
    monkeypatch.setattr(conf, "get", lambda: capped)
    services.org_set_runs_per_hour_limit(org=acme, limit=1000)
    gha_group(acme)
    pending_runs(acme, 6)

    Dispatcher().tick()

    assert in_flight(acme) == 2
    assert candidates.org_in_flight(acme.id) == candidates.InFlight(count=2, cap=2)
    Organization.objects.filter(id=acme.id).update(max_in_flight=4)  # the org's own cap wins
    Dispatcher().tick()
    assert in_flight(acme) == 4
    assert candidates.org_in_flight(acme.id).at_cap


@pytest.mark.django_db
def test_an_org_another_dispatcher_holds_is_skipped_not_waited_on(
    acme: Organization, globex: Organization, github: FakeGitHub, clean_buckets: None
) -> None:
    for org in (acme, globex):
        services.org_set_runs_per_hour_limit(org=org, limit=1000)
    gha_group(acme)
    gha_group(globex, name="g-actions")
    pending_runs(acme, 2)
    pending_runs(globex, 2, prefix="g")
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [dispatcher_sql.LOCK_CLASS, acme.id])

        result = Dispatcher().tick()

    assert result.busy_orgs == {acme.id}
    assert result.claims[acme.id] == 0
    assert in_flight(acme) == 0
    assert in_flight(globex) == 2


@pytest.mark.django_db(transaction=True)
def test_two_dispatchers_at_once_keep_the_cap_and_claim_each_run_once(
    acme: Organization, github: FakeGitHub, clean_buckets: None
) -> None:
    from django.db import connections

    services.org_set_runs_per_hour_limit(org=acme, limit=100_000)
    Organization.objects.filter(id=acme.id).update(max_in_flight=7)
    gha_group(acme)
    pending_runs(acme, 20)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def dispatch() -> None:
        try:
            start.wait(10)
            for _ in range(3):
                Dispatcher().tick()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=dispatch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)

    assert errors == []
    assert in_flight(acme) == 7
    runs = Run.objects.filter(organization=acme, status=RunStatus.ASSIGNED)
    assert runs.count() == 7
    assert len({r.assigned_runner_id for r in runs}) == 7
    assert len(github.dispatches) == 7
