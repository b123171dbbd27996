"""The dispatcher's passes over workflow runs: cancel what can no longer run, fail what ended without ``done``."""

from __future__ import annotations

import pytest
from django.utils import timezone

from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch.dispatcher import Dispatcher
from tests.github.conftest import gha_group, pending_runs
from tests.github.fakes import FakeGitHub

pytestmark = pytest.mark.django_db


def dispatched(org: Organization, n: int = 1) -> list[tuple[Run, Runner]]:
    gha_group(org)
    runs = pending_runs(org, n)
    assert Dispatcher().tick().launched == n
    out = []
    for run in runs:
        run.refresh_from_db()
        out.append((run, Runner.objects.get(id=run.assigned_runner_id)))
    return out


def test_cancelling_a_dispatched_run_cancels_its_workflow_run(acme: Organization, github: FakeGitHub) -> None:
    ((run, runner),) = dispatched(acme)

    services.run_request_cancellation(run_id=run.id)
    result = Dispatcher().tick()

    assert Run.objects.get(id=run.id).status == RunStatus.CANCELLED
    assert github.cancels == [runner.workflow_run_id]
    assert github.runs[runner.workflow_run_id].conclusion == "cancelled"
    assert result.released == 1
    assert not Runner.objects.filter(id=runner.id).exists()  # its group slot is free at once
    assert RunnerGroup.objects.get(id=runner.runner_group_id).runner_count == 0


def test_a_skipped_deployment_cancels_its_workflow_run(acme: Organization, github: FakeGitHub) -> None:
    ((run, runner),) = dispatched(acme)

    services.deployment_skip(deployment_id=run.deployment_id)
    Dispatcher().tick()

    assert github.cancels == [runner.workflow_run_id]
    assert not Runner.objects.filter(id=runner.id).exists()


def test_a_running_run_is_left_to_its_runner(acme: Organization, github: FakeGitHub) -> None:
    ((run, runner),) = dispatched(acme)
    services.run_accept(run_id=run.id, runner_id=runner.id)

    services.run_request_cancellation(run_id=run.id)
    Dispatcher().tick()

    # The runner sees the request on /status, stops its steps and reports: no cancel from here.
    assert github.cancels == []
    assert Runner.objects.filter(id=runner.id).exists()


def test_a_workflow_run_that_ended_without_done_fails_the_run_as_runner_lost(
    acme: Organization, github: FakeGitHub
) -> None:
    ((run, runner), (other, other_runner)) = dispatched(acme, 2)
    services.run_accept(run_id=run.id, runner_id=runner.id)
    services.run_accept(run_id=other.id, runner_id=other_runner.id)
    assert runner.workflow_run_id is not None
    github.complete(runner.workflow_run_id, "failure")  # the job died; the runner never said done

    result = Dispatcher().tick()

    assert result.ended == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert run.failure_reason.startswith("runner lost: GitHub workflow run")
    assert "runner_lost" in [e.kind for e in run.events.all()]
    assert not Runner.objects.filter(id=runner.id).exists()
    assert Run.objects.get(id=other.id).status == RunStatus.RUNNING  # its workflow run still runs


def test_a_workflow_run_that_ended_before_its_runner_accepted_is_a_dispatch_failure(
    acme: Organization, github: FakeGitHub
) -> None:
    ((run, runner),) = dispatched(acme)
    assert runner.workflow_run_id is not None
    github.complete(runner.workflow_run_id, "startup_failure")

    Dispatcher().tick()

    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert "ended (startup_failure) before its runner accepted" in run.failure_reason
    group = RunnerGroup.objects.get(id=runner.runner_group_id)
    assert "startup_failure" in group.last_dispatch_error
    assert not Runner.objects.filter(id=runner.id).exists()


def test_a_workflow_run_that_finished_normally_changes_nothing(acme: Organization, github: FakeGitHub) -> None:
    ((run, runner),) = dispatched(acme)
    services.run_accept(run_id=run.id, runner_id=runner.id)
    services.run_finish(run_id=run.id, runner_id=runner.id, outcome="succeeded", exit_code=0)
    services.runner_deregister(runner_id=runner.id)
    assert runner.workflow_run_id is not None
    github.complete(runner.workflow_run_id, "success")

    result = Dispatcher().tick(timezone.now())

    assert result.ended == 0
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCEEDED


def test_a_runner_that_does_not_stop_a_cancelled_run_in_time_has_its_workflow_run_cancelled(
    acme: Organization, github: FakeGitHub
) -> None:
    from datetime import timedelta

    ((run, runner),) = dispatched(acme)
    services.run_accept(run_id=run.id, runner_id=runner.id)
    asked = timezone.now()
    services.run_request_cancellation(run_id=run.id, now=asked)

    soon = Dispatcher().tick(asked + timedelta(seconds=30))  # the runner is given time to stop its steps

    assert github.cancels == []
    assert soon.ended == 0
    late = Dispatcher().tick(asked + timedelta(minutes=3))

    assert github.cancels == [runner.workflow_run_id]
    assert late.ended == 1  # the cancelled workflow run is seen ended in the same tick
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert "cancelled: GitHub workflow run" in run.failure_reason
    assert not Runner.objects.filter(id=runner.id).exists()
