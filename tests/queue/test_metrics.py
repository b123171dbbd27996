"""/metrics parsed by prometheus_client's own parser: queue depth by reason, group slots, runnable demand,
run timings and finished runs; and GET /runner-groups/demand."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Organization, RunnerGroup, Stack
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.queue.helpers import poll, spend_budget
from tests.throttle.helpers import group_api

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_buckets")]


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = Client().get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def gauge(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def demand_of(group: RunnerGroup) -> float:
    return gauge(scrape(), "gantry_runner_group_runnable_demand", org="acme", group=str(group.id))


def test_runnable_demand_follows_fills_drains_and_throttles(acme: Organization, owner_api: APIClient) -> None:
    small = make_group(acme, "small", {"os": "linux"}, max_concurrent_runs=1)
    stacks = [make_stack(acme, f"s{i}", {"os": "linux"}) for i in range(3)]
    for s in stacks:
        deploy(s)
    assert demand_of(small) == 3

    # The group fills: the claimed run is no longer demand; the two left still are (more slots would take them).
    assert poll(small) is not None
    samples = scrape()
    assert gauge(samples, "gantry_runner_group_runnable_demand", org="acme", group=str(small.id)) == 2
    assert gauge(samples, "gantry_runner_group_slots_used", org="acme", group=str(small.id)) == 1
    assert gauge(samples, "gantry_runner_group_slots_free", org="acme", group=str(small.id)) == 0
    assert gauge(samples, "gantry_runner_group_running", org="acme", group=str(small.id)) == 1
    assert gauge(samples, "gantry_queue_runs_waiting", org="acme", reason="groups_at_capacity") == 2
    assert gauge(samples, "gantry_queue_runs_waiting", org="acme", reason="runner_booting") == 1

    # Drained: more runners would not help.
    assert owner_api.post(f"/api/v1/runner-groups/{small.id}/drain").status_code == 200
    assert demand_of(small) == 0
    assert gauge(scrape(), "gantry_queue_runs_waiting", org="acme", reason="groups_drained") == 2
    assert owner_api.post(f"/api/v1/runner-groups/{small.id}/undrain").status_code == 200
    assert demand_of(small) == 2

    # Throttled: neither would they.
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    spend_budget(acme)
    assert demand_of(small) == 0
    assert gauge(scrape(), "gantry_queue_runs_waiting", org="acme", reason="org_throttled") == 2


def test_demand_counts_only_the_runs_a_group_can_take(acme: Organization, group: RunnerGroup) -> None:
    mac = make_group(acme, "mac", {"os": "macos"})
    deploy(make_stack(acme, "linux-job", {"os": "linux"}))
    deploy(make_stack(acme, "linux-job-2", {"os": "linux", "arch": "amd64"}))
    deploy(make_stack(acme, "gpu-job", {"os": "linux", "gpu": "a100"}))
    samples = scrape()
    assert gauge(samples, "gantry_runner_group_runnable_demand", org="acme", group=str(group.id)) == 2
    assert gauge(samples, "gantry_runner_group_runnable_demand", org="acme", group=str(mac.id)) == 0
    assert gauge(samples, "gantry_queue_runs_waiting", org="acme", reason="no_matching_group") == 1
    assert gauge(samples, "gantry_queue_runs_waiting", org="acme", reason="no_runner_polling") == 2


def test_the_demand_endpoint_answers_the_groups_own_figures(acme: Organization, stack: Stack) -> None:
    small = make_group(acme, "small", {"os": "linux"}, max_concurrent_runs=2)
    deploy(stack)
    deploy(make_stack(acme, "api", {"os": "linux"}))
    client = group_api(small)

    assert client.get("/api/v1/runner-groups/demand").json() == {"runnable": 2, "running": 0, "max_concurrent_runs": 2}
    assert poll(small) is not None
    assert client.get("/api/v1/runner-groups/demand").json() == {"runnable": 1, "running": 1, "max_concurrent_runs": 2}


def test_the_demand_endpoint_takes_only_a_group_token(owner_api: APIClient, group: RunnerGroup) -> None:
    assert owner_api.get("/api/v1/runner-groups/demand").status_code == 403
    assert APIClient().get("/api/v1/runner-groups/demand").status_code == 401


def test_run_timings_and_outcomes_are_recorded_after_commit(
    acme: Organization, stack: Stack, group: RunnerGroup, django_capture_on_commit_callbacks: Any
) -> None:
    from gantry import metrics

    metrics.SCRAPE_REGISTRY  # noqa: B018 - the registry exists before the first record
    from gantry import redis as gantry_redis

    gantry_redis.client().delete(metrics._runs_key())
    run = deploy(stack)
    claim = poll(group)
    assert claim is not None
    with django_capture_on_commit_callbacks(execute=True):
        services.run_accept(run_id=run.id, runner_id=claim["runner_id"])
    with django_capture_on_commit_callbacks(execute=True):
        services.run_finish(run_id=run.id, outcome="succeeded", exit_code=0)

    samples = scrape()
    for name in ("pending_to_claimed", "claimed_to_accepted", "pending_to_finished"):
        assert gauge(samples, f"gantry_run_{name}_seconds_count", org="acme") == 1
    assert gauge(samples, "gantry_runs_finished_total", org="acme", outcome="succeeded") == 1
    assert gauge(samples, "gantry_runs_finished_total", org="acme", outcome="failure") == 0


def test_http_requests_are_counted_by_route_pattern_not_path(teammate_api: APIClient, stack: Stack) -> None:
    run = deploy(stack)
    teammate_api.get(f"/api/v1/runs/{run.id}")
    samples = scrape()
    key = ("gantry_http_request_duration_seconds_count", (("method", "GET"), ("route", "api/v1/runs/<uuid:pk>"),
                                                          ("status", "200")))  # fmt: skip
    assert samples[key] >= 1
    assert not any(str(run.id) in str(labels) for (_, labels) in samples)


def test_run_figures_wait_in_the_process_and_reach_redis_in_one_summed_flush(acme: Organization) -> None:
    from gantry import metrics
    from gantry import redis as gantry_redis

    key = metrics._runs_key()
    metrics.flush_runs()  # whatever earlier tests left behind
    gantry_redis.client().delete(key)
    for seconds in (0.5, 0.7, 4.0):
        metrics.record_run(organization_id=acme.id, timings={"pending_to_claimed": seconds}, finished="succeeded")
    # Buffered: the runner routes make no Redis call for their figures.
    assert gantry_redis.client().hgetall(key) == {}
    metrics.flush_runs()
    stored = {k.decode(): v.decode() for k, v in gantry_redis.client().hgetall(key).items()}
    assert stored[f"bucket|pending_to_claimed|{acme.id}|0"] == "2"  # 0.5 and 0.7 (le 1), summed before the write
    assert stored[f"bucket|pending_to_claimed|{acme.id}|2"] == "1"  # 4.0 (le 5)
    assert stored[f"finished|{acme.id}|succeeded"] == "3"
    assert float(stored[f"sum|pending_to_claimed|{acme.id}"]) == pytest.approx(5.2)
    metrics.flush_runs()  # nothing left: nothing written twice
    assert gantry_redis.client().hget(key, f"finished|{acme.id}|succeeded") == b"3"


def test_the_background_flush_writes_buffered_figures_within_a_second_or_two(acme: Organization) -> None:
    import time

    from gantry import metrics
    from gantry import redis as gantry_redis

    key = metrics._runs_key()
    metrics.flush_runs()
    gantry_redis.client().delete(key)
    metrics.record_run(organization_id=acme.id, timings={}, finished="failure")
    deadline = time.monotonic() + 10 * metrics.FLUSH_SECONDS
    while gantry_redis.client().hget(key, f"finished|{acme.id}|failure") is None:
        assert time.monotonic() < deadline, "the flusher thread never wrote the buffered figure"
        time.sleep(0.05)
