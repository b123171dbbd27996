"""Runs and deployments are read-only; their actions go through the state machine's services."""

from __future__ import annotations

from django.test import Client

from gantry.core import services
from gantry.core.models import Deployment, DeploymentStatus, Run, RunEvent, Runner, RunnerGroup, RunStatus, Stack
from tests.admin.helpers import messages_of, url


def _act(client: Client, model: str, action: str, *pks: object) -> list[str]:
    r = client.post(
        url(model), {"action": action, "_selected_action": [str(pk) for pk in pks], "index": "0"}, follow=True
    )
    assert r.status_code == 200
    return messages_of(r)


def test_it_cancels_a_pending_run(owner_admin: Client, run: Run) -> None:
    msgs = _act(owner_admin, "run", "cancel", run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.cancel_requested_at is not None
    event = RunEvent.objects.get(run=run, kind="cancelled")
    assert event.detail == {"by": "owner"}
    assert any("cancel 1 run" in m for m in msgs)


def test_it_reports_each_refusal_by_name(owner_admin: Client, stack: Stack, run: Run) -> None:
    services.run_request_cancellation(run_id=run.id)
    queued = services.deployment_create(stack=stack).runs.get()  # promoted when the first was cancelled
    msgs = _act(owner_admin, "run", "cancel", run.id, queued.id)
    queued.refresh_from_db()
    assert queued.status == RunStatus.CANCELLED  # the refusal did not stop the rest
    refusals = [m for m in msgs if str(run.id) in m]
    assert refusals == [f"Run {run.id}: run is cancelled; a finished run cannot be cancelled"]


def test_it_skips_a_queued_deployment(owner_admin: Client, run: Run) -> None:
    _act(owner_admin, "deployment", "skip", run.deployment_id)
    run.refresh_from_db()
    assert run.status == RunStatus.DISCARDED
    assert Deployment.objects.get(pk=run.deployment_id).status == DeploymentStatus.SKIPPED


def test_it_retries_a_cancelled_deployment_and_refuses_a_queued_one(
    owner_admin: Client, stack: Stack, run: Run
) -> None:
    services.run_request_cancellation(run_id=run.id)
    waiting = services.deployment_create(stack=stack)
    msgs = _act(owner_admin, "deployment", "retry", run.deployment_id, waiting.id)
    assert list(Run.objects.filter(deployment_id=run.deployment_id).values_list("attempt", flat=True)) == [1, 2]
    assert Deployment.objects.get(pk=run.deployment_id).status == DeploymentStatus.QUEUED
    assert any(m.startswith(f"{waiting}: only a failed") for m in msgs)
    assert waiting.runs.count() == 1


def test_it_shows_run_events_in_time_order(owner_admin: Client, run: Run) -> None:
    services.run_request_cancellation(run_id=run.id)
    r = owner_admin.get(url("run", "change", run.id))
    assert r.status_code == 200
    events = r.context["inline_admin_formsets"][0].formset.queryset
    assert [e.kind for e in events] == ["created", "cancelled"]


def test_it_keeps_runs_and_deployments_read_only(root_admin: Client, run: Run) -> None:
    assert root_admin.get(url("run", "add")).status_code == 403
    assert root_admin.get(url("deployment", "add")).status_code == 403
    r = root_admin.post(url("run", "change", run.id), {"status": RunStatus.SUCCEEDED})
    assert r.status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    # View-only: the page renders without a save button.
    page = root_admin.get(url("run", "change", run.id))
    assert page.status_code == 200
    assert b'name="_save"' not in page.content


def test_it_keeps_runners_read_only(owner_admin: Client, group: RunnerGroup) -> None:
    runner = Runner.objects.create(runner_group=group, hostname="box-1")
    assert owner_admin.get(url("runner")).context["cl"].result_list[0] == runner
    assert owner_admin.post(url("runner", "change", runner.pk), {"hostname": "x"}).status_code == 403
    assert owner_admin.get(url("runner", "delete", runner.pk)).status_code == 403
    runner.refresh_from_db()
    assert runner.hostname == "box-1"


def test_it_searches_runs_by_id(owner_admin: Client, run: Run, stack: Stack) -> None:
    r = owner_admin.get(url("run"), {"q": str(run.id)})
    assert list(r.context["cl"].result_list) == [run]
    r = owner_admin.get(url("run"), {"q": "not-a-uuid"})
    assert list(r.context["cl"].result_list) == []
