"""A run's phases (docs/performance.md, "A run's phases"): the claim stamps ``first_claimed_at`` once, the run
answer's ``timings`` and the run page say wait, start, first output and run time, and /metrics serves
``gantry_run_start_seconds`` and ``gantry_run_first_output_seconds`` by group.

Every step is a real service call at an explicit time; ``first_output_at`` is stamped by the runner's live push
(slice L), so until that lands these tests write it as that push will: once, on the run row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from gantry import conf, metrics
from gantry import redis as gantry_redis
from gantry.core import services
from gantry.core.models import Run, Runner, RunnerGroup, RunStatus, Stack
from gantry.dispatch.claim import Claim, claim
from tests.core.drive import at, deploy, reload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_buckets")]

Capture = Callable[..., Any]


@pytest.fixture(autouse=True)
def no_earlier_figures() -> None:
    # The run figures live in one Redis hash per test database: earlier tests' runs would add to the counts.
    metrics.flush_runs()
    gantry_redis.client().delete(metrics._runs_key())


def claim_at(group: RunnerGroup, now: datetime) -> Claim:
    won = claim(group=group, now=now)
    assert won is not None
    return won


def stamp_first_output(run: Run, now: datetime) -> None:
    """What the live push does on a run's first output (slice L): set first_output_at once."""
    with connection.cursor() as cur:
        cur.execute("UPDATE run SET first_output_at = COALESCE(first_output_at, %s) WHERE id = %s", [now, run.id])


def run_through(
    stack: Stack,
    group: RunnerGroup,
    capture: Capture,
    *,
    claimed: float,
    accepted: float,
    output: float | None,
    finished: float,
) -> Run:
    """Deploy at 0, claim, accept, first output (if any) and finish at the given seconds; the metrics on commit."""
    run = deploy(stack, now=at(0))
    won = claim_at(group, at(claimed))
    assert won.run_id == run.id
    with capture(execute=True):
        services.run_accept(run_id=run.id, runner_id=won.runner_id, now=at(accepted))
    if output is not None:
        stamp_first_output(run, at(output))
    with capture(execute=True):
        services.run_finish(run_id=run.id, outcome="succeeded", runner_id=won.runner_id, exit_code=0, now=at(finished))
    return reload(run)


def test_the_first_claim_is_stamped_once_and_a_second_claim_after_a_lapsed_lease_keeps_it(
    stack: Stack, group: RunnerGroup
) -> None:
    run = deploy(stack, now=at(0))
    assert reload(run).first_claimed_at is None

    first = claim_at(group, at(3))
    assert (reload(run).first_claimed_at, reload(run).assigned_at) == (at(3), at(3))

    # The lease lapses and the first runner is gone: a second claim takes the run.
    lapsed = at(3) + timedelta(seconds=conf.get().assignment_ttl + 1)
    services.run_reset_lease(run_id=run.id, now=lapsed)
    Runner.objects.filter(id=first.runner_id).delete()
    second = claim_at(group, lapsed + timedelta(seconds=2))
    assert second.run_id == run.id

    again = reload(run)
    assert again.assigned_at == lapsed + timedelta(seconds=2)
    assert again.first_claimed_at == at(3)


def test_the_run_answer_times_every_phase_and_start_is_the_accepted_claims(
    stack: Stack, group: RunnerGroup, owner_api: APIClient, django_capture_on_commit_callbacks: Capture
) -> None:
    run = deploy(stack, now=at(0))
    body = owner_api.get(f"/api/v1/runs/{run.id}").json()
    assert (body["first_claimed_at"], body["first_output_at"]) == (None, None)
    assert body["timings"] == {"wait_seconds": None, "start_seconds": None, "first_output_seconds": None,
                               "run_seconds": None}  # fmt: skip

    # First claim at 2 s lapses; the second claim (at lapsed + 1 s) is the one its runner accepts 0.25 s later.
    first = claim_at(group, at(2))
    lapsed = at(2) + timedelta(seconds=conf.get().assignment_ttl + 1)
    services.run_reset_lease(run_id=run.id, now=lapsed)
    Runner.objects.filter(id=first.runner_id).delete()
    second = claim_at(group, lapsed + timedelta(seconds=1))
    accepted = lapsed + timedelta(seconds=1.25)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_accept(run_id=run.id, runner_id=second.runner_id, now=accepted)

    # start counts from the first claim: the lapsed lease is part of this run's start.
    start = (accepted - at(2)).total_seconds()
    body = owner_api.get(f"/api/v1/runs/{run.id}").json()
    assert body["timings"] == {"wait_seconds": 2.0, "start_seconds": start, "first_output_seconds": None,
                               "run_seconds": None}  # fmt: skip

    stamp_first_output(run, accepted + timedelta(seconds=0.5))
    with django_capture_on_commit_callbacks(execute=True):
        services.run_finish(run_id=run.id, outcome="succeeded", runner_id=second.runner_id, exit_code=0,
                            now=accepted + timedelta(seconds=4))  # fmt: skip

    body = owner_api.get(f"/api/v1/runs/{run.id}").json()
    assert body["status"] == RunStatus.SUCCEEDED
    assert body["timings"] == {"wait_seconds": 2.0, "start_seconds": start, "first_output_seconds": 0.5,
                               "run_seconds": 4.0}  # fmt: skip
    assert body["first_claimed_at"].startswith("2030-01-01T12:00:02")
    assert body["first_output_at"] is not None


def test_a_run_that_never_printed_has_no_first_output(
    stack: Stack, group: RunnerGroup, owner_api: APIClient, django_capture_on_commit_callbacks: Capture
) -> None:
    run = run_through(stack, group, django_capture_on_commit_callbacks, claimed=1, accepted=1.1, output=None,
                      finished=3)  # fmt: skip
    timings = owner_api.get(f"/api/v1/runs/{run.id}").json()["timings"]
    assert timings["first_output_seconds"] is None
    assert timings["run_seconds"] == pytest.approx(1.9)


def histogram(name: str) -> dict[tuple[str, str], dict[str, float]]:
    """(org, runner_group) -> {"count", "sum", "le=<bound>"} of ``name`` as /metrics serves it."""
    response = Client().get("/metrics")
    assert response.status_code == 200
    families = [f for f in text_string_to_metric_families(response.content.decode()) if f.name == name]
    assert len(families) == 1
    assert families[0].type == "histogram"
    out: dict[tuple[str, str], dict[str, float]] = {}
    for s in families[0].samples:
        labels = dict(s.labels)
        le = labels.pop("le", None)
        assert set(labels) == {"org", "runner_group"}
        entry = out.setdefault((labels["org"], labels["runner_group"]), {})
        if s.name == f"{name}_bucket":
            entry[f"le={float(le or 'nan')}"] = s.value
        else:
            entry[s.name.rsplit("_", 1)[1]] = s.value
    return out


def test_start_and_first_output_histograms_count_each_run_by_group(
    stack: Stack, group: RunnerGroup, django_capture_on_commit_callbacks: Capture
) -> None:
    other = services.stack_create(org=stack.organization, name="api", labels=dict(stack.labels), spec=stack.spec)
    # Start 0.04 s and 0.3 s; first output 0.2 s after the first accept; the second run printed nothing.
    run_through(stack, group, django_capture_on_commit_callbacks, claimed=1, accepted=1.04, output=1.24, finished=2)
    run_through(other, group, django_capture_on_commit_callbacks, claimed=1.5, accepted=1.8, output=None, finished=3)

    start = histogram("gantry_run_start_seconds")
    assert set(start) == {("acme", "linux")}
    linux = start[("acme", "linux")]
    assert linux["count"] == 2
    assert linux["sum"] == pytest.approx(0.34)
    assert (linux["le=0.025"], linux["le=0.05"], linux["le=0.25"], linux["le=0.5"], linux["le=inf"]) == (0, 1, 1, 2, 2)

    first_output = histogram("gantry_run_first_output_seconds")
    assert set(first_output) == {("acme", "linux")}
    out = first_output[("acme", "linux")]
    assert (out["count"], out["le=0.1"], out["le=0.25"]) == (1, 0, 1)
    assert out["sum"] == pytest.approx(0.2)


def test_a_rolled_back_accept_observes_nothing(
    stack: Stack, group: RunnerGroup, django_capture_on_commit_callbacks: Capture
) -> None:
    run = deploy(stack, now=at(0))
    won = claim_at(group, at(1))
    # The on-commit callbacks are captured, never run: the transaction (the test's) never commits.
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.run_accept(run_id=run.id, runner_id=won.runner_id, now=at(1.1))
    assert len(callbacks) == 1
    assert histogram("gantry_run_start_seconds") == {}


def test_the_run_page_says_the_phases_in_words(
    stack: Stack, group: RunnerGroup, owner: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    run = run_through(stack, group, django_capture_on_commit_callbacks, claimed=3, accepted=3.14, output=3.5,
                      finished=15)  # fmt: skip
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{run.id}?partial=1").content.decode()
    assert 'data-phase="wait"><strong>Waited</strong> 3.0 s for a runner</li>' in page
    assert 'data-phase="start"><strong>Start</strong> its runner started in 140 ms</li>' in page
    assert 'data-phase="first-output"><strong>First output</strong> 360 ms after start</li>' in page
    assert 'data-phase="run"><strong>Ran</strong> 11 s</li>' in page
