"""/metrics' wait histogram ``gantry_run_wait_seconds{org, runner_group, priority}`` (docs/queue.md, "The wait
metric"), after real claims through ``gantry.dispatch.claim.claim`` at explicit times, parsed by
prometheus_client's own parser."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gantry import metrics
from gantry import redis as gantry_redis
from gantry.core import services
from gantry.core.models import Organization, Priority, Run, RunnerGroup, Stack
from gantry.dispatch.claim import claim
from tests.dispatch.helpers import at, make_group, make_stack

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_buckets")]

FAMILY = "gantry_run_wait_seconds"


@pytest.fixture(autouse=True)
def no_earlier_figures() -> None:
    # The run figures live in one Redis hash per test database: earlier tests' claims would add to the counts.
    metrics.flush_runs()
    gantry_redis.client().delete(metrics._runs_key())


def deploy(stack: Stack, priority: Priority, *, now: datetime) -> Run:
    deployment = services.deployment_create(stack=stack, priority=priority, now=now)
    return Run.objects.get(deployment=deployment)


def claim_at(group: RunnerGroup, seconds: float) -> Run:
    won = claim(group=group, now=at(seconds))
    assert won is not None
    return Run.objects.get(id=won.run_id)


def wait_samples() -> list[Sample]:
    response = Client().get("/metrics")
    assert response.status_code == 200
    families = [f for f in text_string_to_metric_families(response.content.decode()) if f.name == FAMILY]
    assert len(families) == 1
    assert families[0].type == "histogram"
    return families[0].samples


def series(samples: list[Sample]) -> dict[tuple[str, str, str], dict[str, float]]:
    """(org, runner_group, priority) -> {"count": n, "sum": s, "le=<bound>": cumulative count} (bounds as floats)."""
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in samples:
        labels = dict(s.labels)
        le = labels.pop("le", None)
        assert set(labels) == {"org", "runner_group", "priority"}
        entry = out.setdefault((labels["org"], labels["runner_group"], labels["priority"]), {})
        if s.name == f"{FAMILY}_bucket":
            entry[f"le={float(le or 'nan')}"] = s.value
        elif s.name in (f"{FAMILY}_count", f"{FAMILY}_sum"):
            entry[s.name.rsplit("_", 1)[1]] = s.value
    return out


def test_waits_are_counted_by_group_and_priority_in_the_right_buckets(acme: Organization) -> None:
    linux = make_group(acme, "linux", {"os": "linux"}, max_concurrent_runs=10)
    mac = make_group(acme, "mac", {"os": "macos"}, max_concurrent_runs=10)
    # All pending from t=0 (no aging within these waits: the window is 900 s); each claim's wait is its time.
    for i in range(2):
        deploy(make_stack(acme, f"lh{i}", {"os": "linux"}), Priority.HIGH, now=at(0))
    deploy(make_stack(acme, "ll", {"os": "linux"}), Priority.LOW, now=at(0))
    deploy(make_stack(acme, "mh", {"os": "macos"}), Priority.HIGH, now=at(0))
    for i in range(3):
        deploy(make_stack(acme, f"ml{i}", {"os": "macos"}), Priority.LOW, now=at(0))

    claimed = [claim_at(linux, 3), claim_at(linux, 4), claim_at(linux, 40)]
    assert [r.priority for r in claimed] == [Priority.HIGH, Priority.HIGH, Priority.LOW]
    claimed = [claim_at(mac, 1), claim_at(mac, 100), claim_at(mac, 200), claim_at(mac, 700)]
    assert [r.priority for r in claimed] == [Priority.HIGH, Priority.LOW, Priority.LOW, Priority.LOW]

    got = series(wait_samples())
    # Only the (group, priority) pairs that claimed: no normal series, no empty ones.
    assert set(got) == {("acme", "linux", "high"), ("acme", "linux", "low"), ("acme", "mac", "high"),
                        ("acme", "mac", "low")}  # fmt: skip
    assert {k: (v["count"], v["sum"]) for k, v in got.items()} == {
        ("acme", "linux", "high"): (2, 7.0),
        ("acme", "linux", "low"): (1, 40.0),
        ("acme", "mac", "high"): (1, 1.0),
        ("acme", "mac", "low"): (3, 1000.0),
    }
    # Cumulative buckets: 3 s and 4 s are above 2.5 and within 5; 40 s within 60 and not 30.
    linux_high, linux_low = got[("acme", "linux", "high")], got[("acme", "linux", "low")]
    assert (linux_high["le=2.5"], linux_high["le=5.0"], linux_high["le=inf"]) == (0, 2, 2)
    assert (linux_low["le=30.0"], linux_low["le=60.0"], linux_low["le=inf"]) == (0, 1, 1)
    # A bound is inclusive (le): a 1 s wait is in le=1.
    assert got[("acme", "mac", "high")]["le=1.0"] == 1
    mac_low = got[("acme", "mac", "low")]
    assert (mac_low["le=60.0"], mac_low["le=120.0"], mac_low["le=300.0"], mac_low["le=600.0"]) == (0, 1, 2, 2)
    assert (mac_low["le=1800.0"], mac_low["le=inf"]) == (3, 3)
