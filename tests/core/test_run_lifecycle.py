"""The executing half of a run: finish, fail, startup timeout, cancellation and its acknowledgement."""

from __future__ import annotations

import pytest

from gantry.core import services
from gantry.core.errors import InvalidRequest, InvalidTransition, RunTerminal
from gantry.core.models import DeploymentStatus, Run, RunnerGroup, RunStatus, RunToken, Stack
from tests.core.drive import (
    advance,
    at,
    deploy,
    deployment_status,
    drive,
    event_count,
    event_kinds,
    reload,
    row,
)

# --------------------------------------------------------------------------
# run_finish
# --------------------------------------------------------------------------


def test_it_finishes_a_running_run_as_succeeded(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))
    nxt = deploy(stack, now=at(5))

    run = services.run_finish(run_id=d.run.id, outcome="succeeded", exit_code=0, sealed_chunks=3, now=at(60))

    assert run.status == RunStatus.SUCCEEDED
    assert run.finished_at == at(60)
    assert run.exit_code == 0
    assert run.sealed_chunks == 3
    assert run.failure_reason == ""
    assert run.assigned_expires_at is None
    assert deployment_status(run) == DeploymentStatus.SUCCEEDED
    assert RunToken.objects.get(run_id=run.id).revoked_at == at(60)
    assert event_kinds(run)[-1] == "finished"
    assert reload(nxt).status == RunStatus.PENDING


def test_it_finishes_a_run_as_failure_with_its_exit_code(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))

    run = services.run_finish(run_id=d.run.id, outcome="failure", exit_code=3, error="step 2 failed", now=at(60))

    assert run.status == RunStatus.FAILURE
    assert run.exit_code == 3
    assert run.failure_reason == "step 2 failed"
    assert deployment_status(run) == DeploymentStatus.FAILED
    assert RunToken.objects.get(run_id=run.id).revoked_at == at(60)


@pytest.mark.parametrize("state", ["requested_cancellation", "cancelling"])
def test_it_finishes_as_cancelled_only_after_a_cancellation_request(
    stack: Stack, group: RunnerGroup, state: str
) -> None:
    d = drive(stack, group, state, now=at(0))
    nxt = deploy(stack, now=at(5))

    run = services.run_finish(run_id=d.run.id, outcome="cancelled", exit_code=143, now=at(60))

    assert run.status == RunStatus.CANCELLED
    assert run.finished_at == at(60)
    assert deployment_status(run) == DeploymentStatus.CANCELLED
    assert RunToken.objects.get(run_id=run.id).revoked_at == at(60)
    assert reload(nxt).status == RunStatus.PENDING


def test_it_refuses_a_cancelled_outcome_for_a_run_nobody_asked_to_cancel(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))
    before, events = row(d.run), event_count()

    with pytest.raises(InvalidTransition) as exc:
        services.run_finish(run_id=d.run.id, outcome="cancelled", now=at(60))

    assert exc.value.code == "invalid_transition"
    assert row(d.run) == before
    assert event_count() == events


@pytest.mark.parametrize("state", ["requested_cancellation", "cancelling"])
def test_it_lets_a_run_under_cancellation_finish_on_its_own(stack: Stack, group: RunnerGroup, state: str) -> None:
    # The steps may end before the runner sees the request: its real outcome stands.
    d = drive(stack, group, state, now=at(0))

    run = services.run_finish(run_id=d.run.id, outcome="succeeded", exit_code=0, now=at(60))

    assert run.status == RunStatus.SUCCEEDED


@pytest.mark.parametrize("outcome", ["discarded", "startup_timeout", "running", "", "SUCCEEDED", "ok"])
def test_it_refuses_an_unknown_outcome_and_changes_nothing(stack: Stack, group: RunnerGroup, outcome: str) -> None:
    d = drive(stack, group, "running", now=at(0))
    before, events = row(d.run), event_count()

    with pytest.raises(InvalidRequest) as exc:
        services.run_finish(run_id=d.run.id, outcome=outcome, now=at(60))

    assert exc.value.http_status == 400
    assert row(d.run) == before
    assert event_count() == events
    assert RunToken.objects.get(run_id=d.run.id).revoked_at is None


# --------------------------------------------------------------------------
# run_fail
# --------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "assigned", "running", "requested_cancellation", "cancelling"])
def test_it_fails_any_lane_holder(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    nxt = deploy(stack, now=at(10))

    run = services.run_fail(run_id=d.run.id, reason="runner lost", event="runner_lost", now=at(60))

    assert run.status == RunStatus.FAILURE
    assert run.failure_reason == "runner lost"
    assert run.finished_at == at(60)
    assert deployment_status(run) == DeploymentStatus.FAILED
    assert event_kinds(run)[-1] == "runner_lost"
    assert reload(nxt).status == RunStatus.PENDING
    if state in ("running", "requested_cancellation", "cancelling"):
        assert RunToken.objects.get(run_id=run.id).revoked_at == at(60)


def test_it_does_not_fail_a_queued_run(stack: Stack, group: RunnerGroup) -> None:
    drive(stack, group, "running", now=at(0))
    queued = deploy(stack, now=at(10))
    before = row(queued)

    with pytest.raises(InvalidTransition):
        services.run_fail(run_id=queued.id, reason="x", now=at(60))

    assert row(queued) == before


# --------------------------------------------------------------------------
# run_startup_timeout
# --------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "assigned"])
def test_it_times_out_a_run_that_never_started(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    nxt = deploy(stack, now=at(10))

    run = services.run_startup_timeout(run_id=d.run.id, now=at(minutes=31))

    assert run.status == RunStatus.STARTUP_TIMEOUT
    assert run.finished_at == at(minutes=31)
    assert run.started_at is None
    assert "startup deadline" in run.failure_reason
    assert deployment_status(run) == DeploymentStatus.FAILED
    assert event_kinds(run)[-1] == "startup_timeout"
    assert reload(nxt).status == RunStatus.PENDING


@pytest.mark.parametrize("state", ["running", "requested_cancellation", "cancelling"])
def test_it_never_times_out_a_started_run(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    before, events = row(d.run), event_count()

    with pytest.raises(InvalidTransition):
        services.run_startup_timeout(run_id=d.run.id, now=at(minutes=31))

    assert row(d.run) == before
    assert event_count() == events


def test_it_never_times_out_a_queued_run(stack: Stack, group: RunnerGroup) -> None:
    drive(stack, group, "running", now=at(0))
    queued = deploy(stack, now=at(10))

    with pytest.raises(InvalidTransition):
        services.run_startup_timeout(run_id=queued.id, now=at(minutes=31))

    assert reload(queued).status == RunStatus.QUEUED


# --------------------------------------------------------------------------
# run_request_cancellation and run_acknowledge_cancel
# --------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "assigned"])
def test_it_cancels_a_never_started_holder_outright_and_promotes(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    nxt = deploy(stack, now=at(10))

    run = services.run_request_cancellation(run_id=d.run.id, now=at(20))

    assert run.status == RunStatus.CANCELLED
    assert run.cancel_requested_at == at(20)
    assert run.finished_at == at(20)
    assert run.assigned_expires_at is None
    assert deployment_status(run) == DeploymentStatus.CANCELLED
    assert event_kinds(run)[-1] == "cancelled"
    assert reload(nxt).status == RunStatus.PENDING
    assert reload(nxt).first_pending_at == at(20)


def test_it_cancels_a_queued_run_outright_and_leaves_the_holder_alone(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))
    queued = deploy(stack, now=at(10))

    run = services.run_request_cancellation(run_id=queued.id, now=at(20))

    assert run.status == RunStatus.CANCELLED
    assert deployment_status(run) == DeploymentStatus.CANCELLED
    assert reload(holder.run).status == RunStatus.RUNNING


def test_it_asks_a_running_run_to_cancel_and_keeps_the_lane(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))
    nxt = deploy(stack, now=at(10))

    run = services.run_request_cancellation(run_id=d.run.id, now=at(20))

    assert run.status == RunStatus.REQUESTED_CANCELLATION
    assert run.cancel_requested_at == at(20)
    assert run.finished_at is None
    assert deployment_status(run) == DeploymentStatus.RUNNING
    assert event_kinds(run)[-1] == "cancel_requested"
    assert reload(nxt).status == RunStatus.QUEUED
    assert RunToken.objects.get(run_id=run.id).revoked_at is None


@pytest.mark.parametrize("state", ["requested_cancellation", "cancelling"])
def test_it_changes_nothing_when_cancellation_is_asked_again(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    before, events = row(d.run), event_count()

    run = services.run_request_cancellation(run_id=d.run.id, now=at(99))

    assert run.status == state
    assert row(d.run) == before
    assert reload(d.run).cancel_requested_at == at(3)  # the first request's time
    assert event_count() == events


@pytest.mark.parametrize(
    "recipe", ["succeeded", "failure", "cancelled", "cancelled_before_start", "discarded", "startup_timeout"]
)
def test_it_refuses_to_cancel_a_finished_run(stack: Stack, group: RunnerGroup, recipe: str) -> None:
    d = drive(stack, group, recipe, now=at(0))
    before, events = row(d.run), event_count()

    with pytest.raises(RunTerminal) as exc:
        services.run_request_cancellation(run_id=d.run.id, now=at(99))

    assert exc.value.code == "run_terminal"
    assert exc.value.http_status == 409
    assert row(d.run) == before
    assert event_count() == events


def test_it_acknowledges_a_cancellation_request(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "requested_cancellation", now=at(0))

    run = services.run_acknowledge_cancel(run_id=d.run.id, now=at(30))

    assert run.status == RunStatus.CANCELLING
    assert run.updated_at == at(30)
    assert deployment_status(run) == DeploymentStatus.RUNNING
    assert event_kinds(run)[-1] == "cancel_acknowledged"


@pytest.mark.parametrize("state", ["pending", "assigned", "running", "cancelling"])
def test_it_refuses_an_acknowledgement_nobody_asked_for(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    before, events = row(d.run), event_count()

    with pytest.raises(InvalidTransition):
        services.run_acknowledge_cancel(run_id=d.run.id, now=at(30))

    assert row(d.run) == before
    assert event_count() == events


def test_it_walks_the_whole_cancellation_path(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))
    nxt = deploy(stack, now=at(5))

    advance(d, group, ["request_cancel", "ack", "finish_cancelled"])

    run = reload(d.run)
    assert run.status == RunStatus.CANCELLED
    assert event_kinds(run) == [
        "created",
        "assigned",
        "accepted",
        "cancel_requested",
        "cancel_acknowledged",
        "finished",
    ]
    assert reload(nxt).status == RunStatus.PENDING
    assert Run.objects.filter(stack=stack, status__in=["pending", "running"]).count() == 1
