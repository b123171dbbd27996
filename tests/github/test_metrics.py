"""The dispatcher's metrics, at /metrics (docs/design.md, "Cross-org fairness"): recorded after each tick,
over only the candidates the tick could serve."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY

from gantry.core import services
from gantry.core.models import Organization
from gantry.dispatch.dispatcher import Dispatcher
from tests.github.conftest import gha_group, pending_runs
from tests.github.fakes import FakeGitHub
from tests.github.test_fairness import spend_budget
from tests.throttle.helpers import dispatches

pytestmark = pytest.mark.django_db


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def saturated() -> float:
    return sample("gantry_dispatch_batch_saturated_total")


def oldest() -> float:
    return sample("gantry_dispatch_oldest_dispatchable_age_seconds")


def test_a_full_batch_counts_as_saturated_and_a_short_one_does_not(
    acme: Organization, github: FakeGitHub, clean_buckets: None
) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1000)
    gha_group(acme)
    now = timezone.now()  # every tick as of this instant: the ages are exact, whatever the machine's pace
    pending_runs(acme, 5, now=now - timedelta(seconds=90))
    before = saturated()
    ticks = sample("gantry_dispatch_tick_duration_seconds_count")

    full = Dispatcher(batch_size=3).tick(now=now)

    assert full.saturated
    assert full.servable == 3
    assert saturated() == before + 1
    assert oldest() == 90.0

    short = Dispatcher(batch_size=3).tick(now=now)  # the last two

    assert short.servable == 2
    assert not short.saturated
    assert saturated() == before + 1
    assert sample("gantry_dispatch_tick_duration_seconds_count") == ticks + 2
    assert sample("gantry_dispatch_launches_total", outcome="launched") >= 5

    idle = Dispatcher(batch_size=3).tick(now=now)
    assert idle.candidates == 0
    assert oldest() == 0.0


def test_the_oldest_dispatchable_age_leaves_out_an_org_the_throttle_refused(
    acme: Organization, globex: Organization, github: FakeGitHub, clean_buckets: None
) -> None:
    # The paging story: acme's backlog is an hour old because of its budget
    # (1/h). Its deferral has just lapsed and the bucket yields one token, so
    # this tick its whole aged backlog is a candidate again: one run goes out,
    # the next claim is throttled. globex's one run is a few seconds old.
    gha_group(acme)
    gha_group(globex, name="g-actions")
    now = timezone.now()  # the tick as of this instant: the ages are exact
    pending_runs(acme, 2, now=now - timedelta(hours=1))
    pending_runs(globex, 1, prefix="g", now=now - timedelta(seconds=5))
    spend_budget(acme, 1, leave=1)
    services.org_set_runs_per_hour_limit(org=globex, limit=1000)
    limited = dispatches("limited")
    before = saturated()

    result = Dispatcher(batch_size=3).tick(now=now)

    assert result.candidates == 3  # the batch was full...
    assert result.launched == 2
    assert result.throttled_orgs == {acme.id}
    assert dispatches("limited") == limited + 1  # ...acme's budget is what the limited count reports,
    assert not result.saturated
    assert saturated() == before  # ...not dispatcher saturation,
    assert oldest() == 5.0  # ...nor an hour-old dispatch latency: only globex's run counts.


def test_the_figures_show_at_metrics_in_any_process(acme: Organization, github: FakeGitHub) -> None:
    gha_group(acme)
    pending_runs(acme, 1)
    Dispatcher().tick()

    text = Client().get("/metrics").content.decode()

    for name in (
        "gantry_dispatch_batch_saturated_total",
        "gantry_dispatch_oldest_dispatchable_age_seconds",
        "gantry_dispatch_tick_duration_seconds_bucket",
        'gantry_dispatch_launches_total{outcome="launched"}',
        'gantry_org_run_dispatch_total{outcome="limited"}',
    ):
        assert name in text, name
