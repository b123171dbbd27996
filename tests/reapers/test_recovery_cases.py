"""The recovery cases of docs/design.md §6, healed by the reapers (docs/design.md, "Important recovery cases").

Each test drives the protocol's services and the real claim at explicit
times, and runs every reaper at each instant, as a beat tick would.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from gantry.core import services
from gantry.core.errors import Conflict
from gantry.core.models import DeploymentStatus, Runner, RunnerGroup, RunStatus, Stack
from gantry.dispatch.claim import claim
from gantry.reapers.reapers import SweepResult, reap
from tests.core.drive import deployment_status

from .helpers import (
    T0,
    accepted,
    after,
    at,
    claim_at,
    claimable,
    deploy,
    event_kinds,
    heartbeat,
    log_manifest,
    reload,
    stuck_in_requested_cancellation,
)


def tick(now: datetime) -> dict[str, SweepResult]:
    return {r.reaper: r for r in reap(now=now)}


def test_it_heals_a_worker_that_never_checks_in(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    first = claim_at(group, T0)

    # The lease lapses: back to pending, but the stub may still boot, so nobody else gets it.
    tick(after(T0, "assignment_ttl", 1))
    assert reload(run).status == RunStatus.PENDING
    assert claim(group=group, now=after(T0, "assignment_ttl", 2)) is None

    # The stub goes at the stub cutoff; the run is re-polled by another runner.
    tick(after(T0, "stub_cutoff", 1))
    assert not Runner.objects.filter(id=first.runner_id).exists()
    second = claim_at(group, after(T0, "stub_cutoff", 2))
    assert (second.run_id, reload(run).assigned_runner_id) == (run.id, second.runner_id)

    # Nobody starts it either: at the startup deadline (counted from T0) it times out.
    ticks = tick(after(T0, "runner_startup_deadline", 1))
    assert ticks["startup_deadline"].counts["timed_out"] == 1
    assert reload(run).status == RunStatus.STARTUP_TIMEOUT
    assert deployment_status(run) == DeploymentStatus.FAILED
    assert event_kinds(run) == ["created", "assigned", "lease_expired", "assigned", "lease_expired", "startup_timeout"]


def test_it_heals_a_worker_that_signals_ready_then_dies(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    c = claim_at(group, T0)
    services.runner_ready(runner_id=c.runner_id, metadata={"hostname": "node-1"}, now=at(5))

    tick(after(T0, "assignment_ttl", 1))
    assert claim(group=group, now=after(T0, "stub_cutoff", -1)) is None  # still held by the ready row

    # Re-dispatchable after the stub cutoff (10 minutes), not after the execution timeout (an hour).
    tick(after(T0, "stub_cutoff", 1))
    assert claimable(run)
    again = claim_at(group, after(T0, "stub_cutoff", 2))
    assert again.run_id == run.id
    assert after(T0, "stub_cutoff", 2) < after(T0, "runner_execution_timeout")


def test_it_heals_a_runner_that_accepts_and_goes_silent(stack: Stack, group: RunnerGroup) -> None:
    run, runner_id = accepted(stack, group, T0)
    queued = deploy(stack, now=at(2))
    last_poll = at(120)
    heartbeat(runner_id=runner_id, run_id=run.id, now=last_poll)

    tick(after(last_poll, "runner_execution_timeout", -1))
    assert reload(run).status == RunStatus.RUNNING

    ticks = tick(after(last_poll, "runner_execution_timeout", 1))

    assert ticks["inactive_runners"].counts["runner_lost"] == 1
    assert reload(run).status == RunStatus.FAILURE
    assert event_kinds(run)[-1] == "runner_lost"
    assert log_manifest(run) is not None  # its log was flushed before the runner row went
    assert not Runner.objects.filter(id=runner_id).exists()
    assert reload(queued).status == RunStatus.PENDING  # lane promoted
    # The failed deployment can be retried.
    services.deployment_retry(deployment_id=run.deployment_id, now=after(last_poll, "runner_execution_timeout", 2))


def test_it_heals_a_lost_accept_response(stack: Stack, group: RunnerGroup) -> None:
    run, runner_id = accepted(stack, group, T0)
    # The first answer never arrived; the runner retries, and the run fails on that evidence.
    with pytest.raises(Conflict) as refused:
        services.run_accept(run_id=run.id, runner_id=runner_id, now=at(3))
    assert refused.value.code == "accept_response_undeliverable"
    assert reload(run).status == RunStatus.FAILURE
    # The runner exits without deregistering; its busy row goes at the execution timeout,
    # and the already-failed run is not failed again.
    events = event_kinds(run)

    tick(after(T0, "runner_execution_timeout", 5))

    assert not Runner.objects.filter(id=runner_id).exists()
    assert event_kinds(run) == events
    assert events.count("accept_response_undeliverable") == 1


def test_it_heals_a_never_started_run_stuck_in_requested_cancellation(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    claim_at(group, T0)
    stuck_in_requested_cancellation(run)
    nxt = deploy(stack, now=at(1))

    tick(after(T0, "assignment_ttl", 1))

    assert reload(run).status == RunStatus.CANCELLED
    assert reload(nxt).status == RunStatus.PENDING
