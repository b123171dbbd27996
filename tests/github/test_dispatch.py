"""The backend dispatcher against the local GitHub: what it dispatches, and what it does with GitHub's refusals."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch.dispatcher import Dispatcher
from tests.github.conftest import OWNER, REF, REPO, gha_group, pending_runs
from tests.github.fakes import Answer, FakeGitHub

pytestmark = pytest.mark.django_db


def test_it_claims_and_dispatches_the_workflow_with_only_the_three_inputs(
    acme: Organization, github: FakeGitHub
) -> None:
    group = gha_group(acme)
    (run,) = pending_runs(acme, 1)

    result = Dispatcher().tick()

    assert result.launched == 1
    run.refresh_from_db()
    assert run.status == RunStatus.ASSIGNED
    (body,) = github.dispatches
    assert body["ref"] == REF
    assert body["return_run_details"] is True
    assert body["inputs"] == {"gantry_url": "http://127.0.0.1:9", "run_id": str(run.id),
                              "runner_id": str(run.assigned_runner_id)}  # fmt: skip
    runner = Runner.objects.get(id=run.assigned_runner_id)
    (workflow_run,) = github.runs.values()
    assert runner.runner_group_id == group.id
    assert runner.workflow_run_id == workflow_run.id
    assert runner.workflow_run_url.endswith(f"/{OWNER}/{REPO}/actions/runs/{workflow_run.id}")
    assert runner.workflow_path == ".github/workflows/gantry-runner.yml"
    assert runner.dispatched_at is not None


def test_a_workflow_named_by_id_is_dispatched_by_id_and_recorded_by_its_file(
    acme: Organization, github: FakeGitHub
) -> None:
    gha_group(acme, github_workflow="161")
    (run,) = pending_runs(acme, 1)

    Dispatcher().tick()

    runner = Runner.objects.get(id=Run.objects.get(id=run.id).assigned_runner_id)
    assert runner.workflow_path == ".github/workflows/gantry-runner.yml"
    assert ("POST", f"/repos/{OWNER}/{REPO}/actions/workflows/161/dispatches") in github.requests


def test_a_github_404_fails_the_run_at_once_with_githubs_message(acme: Organization, github: FakeGitHub) -> None:
    group = gha_group(acme, github_workflow="missing.yml")
    first, _second = pending_runs(acme, 1, prefix="a") + pending_runs(acme, 1, prefix="b")

    result = Dispatcher().tick()

    assert result.failed == 2
    assert result.launched == 0
    first.refresh_from_db()
    assert first.status == RunStatus.FAILURE
    assert "GitHub answered 404: Not Found" in first.failure_reason
    group.refresh_from_db()
    assert "GitHub answered 404: Not Found" in group.last_dispatch_error
    assert group.last_dispatch_error_at is not None
    assert not Runner.objects.filter(runner_group=group).exists()  # the stubs are gone
    assert github.dispatches == []


def test_a_failed_dispatch_promotes_the_stacks_next_run(acme: Organization, github: FakeGitHub) -> None:
    from gantry.core import services

    gha_group(acme)
    (run,) = pending_runs(acme, 1)
    queued = Run.objects.get(deployment=services.deployment_create(stack=run.stack))
    assert queued.status == RunStatus.QUEUED
    github.next_dispatch.append(Answer(422, {"message": "Unexpected inputs provided: ['x']"}))

    Dispatcher().tick()

    run.refresh_from_db()
    queued.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert "422" in run.failure_reason
    assert "Unexpected inputs" in run.failure_reason
    assert queued.status in (RunStatus.PENDING, RunStatus.ASSIGNED)  # the lane moved on


def test_a_403_without_permission_is_definitive(acme: Organization, github: FakeGitHub) -> None:
    group = gha_group(acme)
    pending_runs(acme, 1)
    github.next_dispatch.append(Answer(403, {"message": "Resource not accessible by integration"}))

    result = Dispatcher().tick()

    assert result.failed == 1
    assert result.retried == 0
    group.refresh_from_db()
    assert "Resource not accessible by integration" in group.last_dispatch_error


def test_a_503_is_retried_and_then_succeeds(acme: Organization, github: FakeGitHub) -> None:
    group = gha_group(acme)
    (run,) = pending_runs(acme, 1)
    github.next_dispatch.append(Answer(503, {"message": "Service Unavailable"}, {"Retry-After": "7"}))
    dispatcher = Dispatcher()
    now = timezone.now()

    first = dispatcher.tick(now)

    assert first.retried == 1
    assert first.launched == 0
    assert first.failed == 0
    run.refresh_from_db()
    assert run.status == RunStatus.ASSIGNED  # the claim is kept
    assert dispatcher.next_retry_in(now) == pytest.approx(7, abs=0.01)
    early = dispatcher.tick(now + timedelta(seconds=3))  # before Retry-After: neither retried nor new claims
    assert early.launched == 0
    assert early.retried == 0
    assert sum(early.claims.values()) == 0

    later = dispatcher.tick(now + timedelta(seconds=8))

    assert later.launched == 1
    assert len(github.dispatches) == 1
    runner = Runner.objects.get(id=Run.objects.get(id=run.id).assigned_runner_id)
    assert runner.workflow_run_id in github.runs
    group.refresh_from_db()
    assert group.last_dispatch_error == ""


def test_a_transient_failure_that_outlasts_the_lease_fails_the_run(acme: Organization, github: FakeGitHub) -> None:
    gha_group(acme)
    (run,) = pending_runs(acme, 1)
    github.next_dispatch.extend(Answer(502, {"message": "Bad Gateway"}) for _ in range(50))
    dispatcher = Dispatcher()
    now = timezone.now()

    seen = 0
    for step in range(0, 400, 10):
        seen += dispatcher.tick(now + timedelta(seconds=step)).failed
        if seen:
            break

    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert "502" in run.failure_reason
    assert "gave up after" in run.failure_reason


def test_a_rate_limit_pauses_new_claims_until_the_reset(acme: Organization, github: FakeGitHub) -> None:
    gha_group(acme)
    pending_runs(acme, 3)
    reset = int((timezone.now() + timedelta(seconds=30)).timestamp())
    github.next_dispatch.append(
        Answer(
            403, {"message": "API rate limit exceeded"}, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
        )
    )
    dispatcher = Dispatcher()
    now = timezone.now()

    first = dispatcher.tick(now)

    assert first.retried == 1
    assert first.launched == 0
    assert sum(first.claims.values()) == 1  # stopped claiming: nothing claimed that could not be dispatched
    assert Run.objects.filter(status=RunStatus.ASSIGNED).count() == 1
    after = dispatcher.tick(now + timedelta(seconds=45))
    assert after.launched == 3


def test_a_github_actions_groups_token_cannot_poll(acme: Organization, github: FakeGitHub) -> None:
    from tests.throttle.helpers import group_api

    group = gha_group(acme)
    pending_runs(acme, 1)

    response = group_api(group).get("/api/v1/runner-groups/poll")

    assert response.status_code == 403
    assert response.json()["code"] == "backend_dispatched_group"
    assert not Runner.objects.exists()


def test_drained_and_full_groups_get_nothing(acme: Organization, github: FakeGitHub) -> None:
    from gantry.core import services

    drained = gha_group(acme, name="drained")
    services.runner_group_set_drained(group=drained, drained=True)
    full = gha_group(acme, name="full", labels={"ci": "github", "size": "big"}, max_concurrent_runs=1)
    pending_runs(acme, 3)

    result = Dispatcher().tick()

    # Only the one-slot group serves: one run, then it is full.
    assert result.launched == 1
    assert RunnerGroup.objects.get(id=full.id).runner_count == 1
    assert RunnerGroup.objects.get(id=drained.id).runner_count == 0
    assert Dispatcher().tick().launched == 0


def test_a_run_whose_runner_may_still_boot_is_not_dispatched_again(acme: Organization, github: FakeGitHub) -> None:
    from gantry.core import services

    gha_group(acme)
    (run,) = pending_runs(acme, 1)
    now = timezone.now()
    Dispatcher().tick(now)
    run.refresh_from_db()
    # The lease lapses: the run is pending again but keeps its runner pointer.
    services.run_reset_lease(run_id=run.id, now=now + timedelta(minutes=10))
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    assert run.assigned_runner_id is not None

    result = Dispatcher().tick(now + timedelta(minutes=10))

    # Not a candidate while its runner exists; the release pass then cancels
    # that workflow run (it can never accept now) and deletes the runner...
    assert result.candidates == 0
    assert result.launched == 0
    (first,) = github.runs.values()
    assert result.released == 1
    assert github.cancels == [first.id]
    assert not Runner.objects.filter(id=run.assigned_runner_id).exists()
    # ...so the next tick sends one new workflow run, never a second live one.
    again = Dispatcher().tick(now + timedelta(minutes=10, seconds=1))
    assert again.launched == 1
    assert len(github.dispatches) == 2


def test_manage_py_dispatch_once_runs_one_tick(acme: Organization, github: FakeGitHub) -> None:
    import io

    from django.core.management import CommandError, call_command

    gha_group(acme)
    (run,) = pending_runs(acme, 1)
    out = io.StringIO()

    call_command("dispatch", "--once", stdout=out)

    assert "launched=1" in out.getvalue()
    assert Run.objects.get(id=run.id).status == RunStatus.ASSIGNED
    with pytest.raises(CommandError, match="--once"):
        call_command("dispatch")


def test_without_github_credentials_nothing_is_claimed(
    acme: Organization, github: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gantry import conf

    monkeypatch.delenv("GANTRY_GITHUB_TOKEN")
    conf.github.cache_clear()
    gha_group(acme)
    (run,) = pending_runs(acme, 1)

    result = Dispatcher().tick()

    assert "not configured" in result.summary()
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING


@pytest.mark.django_db(transaction=True)
def test_the_celery_task_runs_the_dispatcher_loop_for_its_period(
    acme: Organization, github: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connections

    from gantry.celery import app
    from gantry.dispatch import tasks

    assert "gantry.dispatch.loop" in app.tasks
    monkeypatch.setattr(tasks, "LOOP_SECONDS", 0.5)
    gha_group(acme)
    (run,) = pending_runs(acme, 1)

    tasks.loop()  # as a worker would run it; returns once its period is over

    connections.close_all()
    assert Run.objects.get(id=run.id).status == RunStatus.ASSIGNED
    assert len(github.dispatches) == 1
