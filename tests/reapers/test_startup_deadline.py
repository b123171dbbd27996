"""Startup deadline: never started within GANTRY_RUNNER_STARTUP_DEADLINE of first becoming pending → startup_timeout."""

from __future__ import annotations

import pytest

from gantry.core import services
from gantry.core.errors import InvalidTransition
from gantry.core.models import DeploymentStatus, RunnerGroup, RunStatus, Stack
from gantry.reapers.reapers import reap, startup_deadline
from tests.core.drive import deployment_status

from .helpers import T0, accepted, after, at, claim_at, deploy, event_kinds, reload, world


def test_it_times_out_a_pending_run_and_promotes_the_lane(stack: Stack) -> None:
    run = deploy(stack, now=T0)
    queued = deploy(stack, now=at(1))

    assert startup_deadline(now=after(T0, "runner_startup_deadline", -1)).counts["timed_out"] == 0
    result = startup_deadline(now=after(T0, "runner_startup_deadline", 1))

    assert result.counts["timed_out"] == 1
    row = reload(run)
    assert (row.status, row.started_at) == (RunStatus.STARTUP_TIMEOUT, None)
    assert "startup deadline" in row.failure_reason
    assert deployment_status(row) == DeploymentStatus.FAILED
    assert event_kinds(run)[-1] == "startup_timeout"
    nxt = reload(queued)
    assert nxt.status == RunStatus.PENDING
    assert nxt.first_pending_at == after(T0, "runner_startup_deadline", 1)


def test_it_waits_for_a_live_lease_to_lapse_before_timing_out(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    late = after(T0, "runner_startup_deadline", -60)
    c = claim_at(group, late)  # claimed a minute before the deadline: its runner is booting

    past_deadline = after(T0, "runner_startup_deadline", 1)
    assert startup_deadline(now=past_deadline).acted == 0
    assert reload(run).status == RunStatus.ASSIGNED
    # So the runner can still accept …
    assert c.assigned_expires_at > past_deadline

    # … and once the lease has lapsed, nobody can: the run times out.
    result = startup_deadline(now=after(late, "assignment_ttl", 1))
    assert result.counts["timed_out"] == 1
    assert reload(run).status == RunStatus.STARTUP_TIMEOUT


def test_it_refuses_to_time_out_under_a_live_lease_when_called_directly(stack: Stack, group: RunnerGroup) -> None:
    deploy(stack, now=T0)
    c = claim_at(group, T0)
    before = world()

    with pytest.raises(InvalidTransition, match="lease has lapsed"):
        services.run_startup_timeout(run_id=c.run_id, now=at(10))

    assert world() == before


def test_it_counts_from_first_eligibility_across_requeues(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    # Two claims whose runners never show up; each run reset, each stub reaped.
    t = T0
    for _ in range(2):
        claim_at(group, t)
        t = after(t, "stub_cutoff", 1)
        reap(now=t, only=["expired_assignments", "inactive_runners"])
    assert t < after(T0, "runner_startup_deadline")
    assert (reload(run).status, reload(run).first_pending_at) == (RunStatus.PENDING, T0)

    result = startup_deadline(now=after(T0, "runner_startup_deadline", 1))

    assert result.counts["timed_out"] == 1
    assert event_kinds(run).count("assigned") == 2


def test_it_never_times_out_a_started_run(stack: Stack, group: RunnerGroup) -> None:
    accepted(stack, group, T0)
    before = world()

    assert startup_deadline(now=at(minutes=600)).acted == 0
    assert world() == before


def test_it_is_idempotent(stack: Stack) -> None:
    deploy(stack, now=T0)
    deploy(stack, now=at(1))
    later = after(T0, "runner_startup_deadline", 1)
    assert startup_deadline(now=later).counts["timed_out"] == 1
    before = world()

    # The promoted run became pending only now: not due.
    assert startup_deadline(now=later).acted == 0
    assert world() == before
