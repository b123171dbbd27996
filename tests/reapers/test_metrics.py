"""Reaper metrics at /metrics: counts per reaper and outcome, and sweep durations, from every process."""

from __future__ import annotations

import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
import redis
from django.test import Client
from django.utils import timezone

from gantry import metrics
from gantry.core.models import RunnerGroup, Stack
from gantry.reapers.reapers import force_delete_runner, reset_expired_assignments

from .helpers import T0, accepted, after, claim_at, deploy


def scrape() -> str:
    response = Client().get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


def value(text: str, name: str, **labels: str) -> float:
    """The sample of ``name`` with exactly ``labels`` (in any order); 0 when absent."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) == labels:
            return float(match.group(2))
    return 0.0


def test_it_counts_what_each_sweep_did_and_times_it(stack: Stack, group: RunnerGroup) -> None:
    # The figures live in Redis and add up across processes (and test runs): compare deltas.
    before = scrape()
    deploy(stack, now=T0)
    claim_at(group, T0)

    reset_expired_assignments(now=after(T0, "assignment_ttl", 1))
    reset_expired_assignments(now=after(T0, "assignment_ttl", 1))

    after_ = scrape()
    reaped = "gantry_reaper_reaped_total"
    reset = {"reaper": "expired_assignments", "outcome": "reset"}
    assert value(after_, reaped, **reset) - value(before, reaped, **reset) == 1
    sweeps = "gantry_reaper_sweep_duration_seconds_count"
    ours = {"reaper": "expired_assignments"}
    assert value(after_, sweeps, **ours) - value(before, sweeps, **ours) == 2
    inf = {"reaper": "expired_assignments", "le": "+Inf"}
    assert value(after_, "gantry_reaper_sweep_duration_seconds_bucket", **inf) == value(after_, sweeps, **ours)
    # Every series exists before its first event.
    assert 'gantry_reaper_reaped_total{outcome="cancelled",reaper="cancellation_backstop"} ' in after_


def test_it_counts_force_deletes(stack: Stack, group: RunnerGroup) -> None:
    before = scrape()
    _, runner_id = accepted(stack, group, timezone.now() - timedelta(minutes=30))

    force_delete_runner(runner_id=runner_id, now=timezone.now())

    after_ = scrape()
    for outcome in ("runner_deleted", "run_failed"):
        labels = {"reaper": "force_delete", "outcome": outcome}
        assert (
            value(after_, "gantry_reaper_reaped_total", **labels)
            - value(before, "gantry_reaper_reaped_total", **labels)
            == 1
        )


def test_it_never_lets_a_redis_outage_stop_a_sweep_or_a_scrape(
    monkeypatch: pytest.MonkeyPatch, stack: Stack, group: RunnerGroup
) -> None:
    deploy(stack, now=T0)
    claim_at(group, T0)
    # Only the metrics lose Redis (the claim above spent its throttle token normally).
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, socket_timeout=0.2)
    monkeypatch.setattr(metrics, "gantry_redis", SimpleNamespace(client=lambda: dead))

    assert reset_expired_assignments(now=after(T0, "assignment_ttl", 1)).counts["reset"] == 1
    assert "gantry_reaper_reaped_total" not in scrape()
