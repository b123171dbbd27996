"""deployment_skip, deployment_retry, and a deployment's status following its newest run."""

from __future__ import annotations

import pytest

from gantry.core import services
from gantry.core.errors import Conflict
from gantry.core.models import Deployment, DeploymentStatus, Run, RunEvent, RunnerGroup, RunStatus, Stack
from tests.core.drive import (
    Driven,
    advance,
    at,
    deploy,
    deployment_status,
    drive,
    event_count,
    event_kinds,
    new_runner,
    newest_run,
    reload,
    row,
)

# --------------------------------------------------------------------------
# Skip
# --------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "assigned"])
def test_it_skips_a_deployment_whose_holder_never_started(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    nxt = deploy(stack, now=at(10))

    deployment = services.deployment_skip(deployment_id=d.run.deployment_id, now=at(20))

    assert deployment.status == DeploymentStatus.SKIPPED
    run = reload(d.run)
    assert run.status == RunStatus.DISCARDED
    assert run.finished_at == at(20)
    assert event_kinds(run)[-1] == "skipped"
    # SkipDeployment leaves the runner pointer in place (docs/design.md, "One Runner Per Run\"); the lease is gone.
    assert run.assigned_runner_id == (d.runner.id if d.runner else None)
    assert run.assigned_expires_at is None
    assert reload(nxt).status == RunStatus.PENDING


def test_it_skips_a_queued_deployment(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))
    queued = deploy(stack, now=at(10))

    deployment = services.deployment_skip(deployment_id=queued.deployment_id, now=at(20))

    assert deployment.status == DeploymentStatus.SKIPPED
    assert reload(queued).status == RunStatus.DISCARDED
    assert reload(holder.run).status == RunStatus.RUNNING


def test_it_records_who_skipped(stack: Stack, group: RunnerGroup, teammate: object) -> None:
    run = deploy(stack, now=at(0))

    services.deployment_skip(deployment_id=run.deployment_id, by=teammate, now=at(1))  # type: ignore[arg-type]

    assert RunEvent.objects.get(run=run, kind="skipped").detail == {"by": "teammate"}


@pytest.mark.parametrize(
    "state",
    [
        "running",
        "requested_cancellation",
        "cancelling",
        "succeeded",
        "failure",
        "cancelled",
        "discarded",
        "startup_timeout",
    ],
)
def test_it_refuses_to_skip_once_started_or_finished(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    before, events = row(d.run), event_count()
    status_before = deployment_status(d.run)

    with pytest.raises(Conflict) as exc:
        services.deployment_skip(deployment_id=d.run.deployment_id, now=at(50))

    assert exc.value.code == "not_skippable"
    assert exc.value.http_status == 409
    assert exc.value.extra["status"] == state
    assert row(d.run) == before
    assert event_count() == events
    assert deployment_status(d.run) == status_before


# --------------------------------------------------------------------------
# Retry
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "recipe", ["failure", "failure_by_fail", "startup_timeout", "cancelled", "cancelled_before_start"]
)
def test_it_retries_a_failed_timed_out_or_cancelled_deployment_on_a_free_lane(
    stack: Stack, group: RunnerGroup, recipe: str
) -> None:
    d = drive(stack, group, recipe, now=at(0))
    old = row(d.run)

    deployment = services.deployment_retry(deployment_id=d.run.deployment_id, now=at(100))

    assert deployment.status == DeploymentStatus.QUEUED
    new = newest_run(deployment.id)
    assert new.id != d.run.id
    assert new.attempt == 2
    assert new.status == RunStatus.PENDING
    assert new.first_pending_at == at(100)
    assert new.created_at == at(100)
    assert new.runner_selector == d.run.runner_selector
    assert new.selector_id == d.run.selector_id
    assert new.assigned_runner_id is None
    # The failed attempt is history: it never changes.
    assert row(d.run) == old
    assert Run.objects.filter(deployment_id=deployment.id).count() == 2


def test_it_queues_a_retry_behind_the_current_holder(stack: Stack, group: RunnerGroup) -> None:
    failed = drive(stack, group, "failure", now=at(0))
    holder = drive(stack, group, "running", now=at(10))
    waiting = deploy(stack, now=at(20))

    deployment = services.deployment_retry(deployment_id=failed.run.deployment_id, now=at(30))

    retry = newest_run(deployment.id)
    assert retry.status == RunStatus.QUEUED
    assert retry.first_pending_at is None
    assert deployment.status == DeploymentStatus.QUEUED
    # The retry queues behind runs queued before it.
    services.run_finish(run_id=holder.run.id, outcome="succeeded", exit_code=0, now=at(40))
    assert reload(waiting).status == RunStatus.PENDING
    assert reload(retry).status == RunStatus.QUEUED
    services.deployment_skip(deployment_id=waiting.deployment_id, now=at(50))
    assert reload(retry).status == RunStatus.PENDING
    assert reload(retry).first_pending_at == at(50)


def test_it_retries_again_and_again(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "failure", now=at(0))
    deployment_id = d.run.deployment_id

    for attempt in (2, 3):
        services.deployment_retry(deployment_id=deployment_id, now=at(attempt * 100))
        run = newest_run(deployment_id)
        assert run.attempt == attempt
        services.run_fail(run_id=run.id, reason="again", now=at(attempt * 100 + 1))

    assert deployment_status(newest_run(deployment_id)) == DeploymentStatus.FAILED
    attempts = Run.objects.filter(deployment_id=deployment_id).order_by("attempt").values_list("attempt", flat=True)
    assert list(attempts) == [1, 2, 3]


@pytest.mark.parametrize(
    "state",
    ["pending", "assigned", "running", "requested_cancellation", "cancelling", "succeeded", "discarded"],
)
def test_it_refuses_to_retry_anything_else(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state, now=at(0))
    before, events, runs = row(d.run), event_count(), Run.objects.count()

    with pytest.raises(Conflict) as exc:
        services.deployment_retry(deployment_id=d.run.deployment_id, now=at(50))

    assert exc.value.code == "not_retryable"
    assert exc.value.http_status == 409
    assert row(d.run) == before
    assert event_count() == events
    assert Run.objects.count() == runs


def test_it_refuses_to_retry_a_queued_deployment(stack: Stack, group: RunnerGroup) -> None:
    drive(stack, group, "running", now=at(0))
    queued = deploy(stack, now=at(10))

    with pytest.raises(Conflict) as exc:
        services.deployment_retry(deployment_id=queued.deployment_id, now=at(50))

    assert exc.value.code == "not_retryable"


def test_it_refuses_to_retry_a_deployment_whose_retry_is_already_under_way(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "failure", now=at(0))
    services.deployment_retry(deployment_id=d.run.deployment_id, now=at(10))

    with pytest.raises(Conflict) as exc:
        services.deployment_retry(deployment_id=d.run.deployment_id, now=at(11))

    assert exc.value.code == "not_retryable"
    assert Run.objects.filter(deployment_id=d.run.deployment_id).count() == 2


# --------------------------------------------------------------------------
# Deployment status follows the newest run
# --------------------------------------------------------------------------


def test_it_makes_the_deployment_status_follow_its_newest_run(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))
    run = deploy(stack, now=at(10))
    deployment_id = run.deployment_id

    def status() -> str:
        return Deployment.objects.get(id=deployment_id).status

    assert reload(run).status == RunStatus.QUEUED
    assert status() == DeploymentStatus.QUEUED

    services.run_finish(run_id=holder.run.id, outcome="succeeded", exit_code=0, now=at(20))
    assert reload(run).status == RunStatus.PENDING
    assert status() == DeploymentStatus.QUEUED

    runner = new_runner(group)
    services.run_assign(run_id=run.id, runner=runner, now=at(21))
    assert status() == DeploymentStatus.QUEUED

    services.run_accept(run_id=run.id, runner_id=runner.id, now=at(22))
    assert status() == DeploymentStatus.RUNNING

    services.run_request_cancellation(run_id=run.id, now=at(23))
    assert status() == DeploymentStatus.RUNNING
    services.run_acknowledge_cancel(run_id=run.id, now=at(24))
    assert status() == DeploymentStatus.RUNNING
    services.run_finish(run_id=run.id, outcome="cancelled", now=at(25))
    assert status() == DeploymentStatus.CANCELLED

    services.deployment_retry(deployment_id=deployment_id, now=at(30))
    assert status() == DeploymentStatus.QUEUED
    second = newest_run(deployment_id)
    services.run_startup_timeout(run_id=second.id, now=at(minutes=40))
    assert status() == DeploymentStatus.FAILED

    services.deployment_retry(deployment_id=deployment_id, now=at(minutes=41))
    third = newest_run(deployment_id)
    d = advance(
        Driven(run=third, now=at(minutes=41)),
        group,
        ["assign", "accept", "finish_succeeded"],
    )
    assert d.run.status == RunStatus.SUCCEEDED
    assert status() == DeploymentStatus.SUCCEEDED


def test_it_reads_skipped_for_a_skipped_deployment_and_failed_for_a_failure(stack: Stack, group: RunnerGroup) -> None:
    skipped = drive(stack, group, "discarded", now=at(0))
    failed = drive(stack, group, "failure", now=at(10))
    timed_out = drive(stack, group, "startup_timeout", now=at(20))
    done = drive(stack, group, "succeeded", now=at(30))

    assert deployment_status(skipped.run) == DeploymentStatus.SKIPPED
    assert deployment_status(failed.run) == DeploymentStatus.FAILED
    assert deployment_status(timed_out.run) == DeploymentStatus.FAILED
    assert deployment_status(done.run) == DeploymentStatus.SUCCEEDED
