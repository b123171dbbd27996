"""Cancellation backstop: a never-started run stuck in requested_cancellation, lease lapsed → cancelled, promoted.

No service creates that state any more, so each test makes it with a raw UPDATE.
"""

from __future__ import annotations

import pytest

from gantry.core import services
from gantry.core.errors import InvalidTransition
from gantry.core.models import DeploymentStatus, Runner, RunnerGroup, RunStatus, Stack
from gantry.reapers.reapers import cancellation_backstop, reap, startup_deadline
from tests.core.drive import deployment_status

from .helpers import (
    T0,
    accepted,
    after,
    at,
    claim_at,
    deploy,
    event_kinds,
    reload,
    stuck_in_requested_cancellation,
    world,
)


def test_it_cancels_a_stuck_never_started_run_and_releases_the_lane(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    c = claim_at(group, T0)
    stuck_in_requested_cancellation(run)
    queued = deploy(stack, now=at(1))
    # It matches no other window: not pending or assigned, never started.
    assert startup_deadline(now=at(minutes=600)).acted == 0

    assert cancellation_backstop(now=after(T0, "assignment_ttl", -1)).acted == 0  # lease still live
    result = cancellation_backstop(now=after(T0, "assignment_ttl", 1))

    assert result.counts["cancelled"] == 1
    row = reload(run)
    assert (row.status, row.started_at) == (RunStatus.CANCELLED, None)
    assert deployment_status(row) == DeploymentStatus.CANCELLED
    assert event_kinds(run)[-1] == "cancel_backstop"
    assert reload(queued).status == RunStatus.PENDING
    # Its stub held the run, so it outlived the stub cutoff; now it goes.
    assert Runner.objects.filter(id=c.runner_id).exists()
    assert reap(now=after(T0, "stub_cutoff", 1), only=["inactive_runners"])[0].counts["stub_deleted"] == 1


def test_it_cancels_a_stuck_run_that_never_had_a_lease(stack: Stack) -> None:
    run = deploy(stack, now=T0)
    stuck_in_requested_cancellation(run)

    assert cancellation_backstop(now=at(1)).counts["cancelled"] == 1
    assert reload(run).status == RunStatus.CANCELLED


def test_it_leaves_a_started_run_whose_cancellation_is_under_way(stack: Stack, group: RunnerGroup) -> None:
    run, _ = accepted(stack, group, T0)
    services.run_request_cancellation(run_id=run.id, now=at(10))
    before = world()

    assert cancellation_backstop(now=at(minutes=600)).acted == 0
    assert world() == before
    with pytest.raises(InvalidTransition, match="never-started"):
        services.run_cancel_backstop(run_id=run.id, now=at(minutes=600))


def test_it_is_idempotent(stack: Stack) -> None:
    run = deploy(stack, now=T0)
    stuck_in_requested_cancellation(run)
    assert cancellation_backstop(now=at(1)).counts["cancelled"] == 1
    before = world()

    assert cancellation_backstop(now=at(1)).acted == 0
    assert world() == before
