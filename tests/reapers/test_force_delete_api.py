"""POST /api/v1/runners/{runner_id}/force-delete: org admins, once the runner is offline past the force gate."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import Run, RunEvent, Runner, RunnerGroup, RunStatus, Stack

from .helpers import accepted, claim_at, claimable, deploy, log_manifest, reload, world


def _url(runner_id: uuid.UUID) -> str:
    return f"/api/v1/runners/{runner_id}/force-delete"


def _ago(minutes: float) -> datetime:
    return timezone.now() - timedelta(minutes=minutes)


def test_it_fails_the_run_promotes_at_once_and_deletes_the_runner(
    owner_api: APIClient, stack: Stack, group: RunnerGroup
) -> None:
    run, runner_id = accepted(stack, group, _ago(20))  # last seen at its accept, 20 minutes ago
    queued = deploy(stack, now=_ago(19))

    response = owner_api.post(_url(runner_id))

    assert response.status_code == 204, response.content
    row = reload(run)
    assert row.status == RunStatus.FAILURE
    assert "force-deleted by owner" in row.failure_reason
    assert RunEvent.objects.filter(run=run, kind="force_deleted").count() == 1
    assert reload(queued).status == RunStatus.PENDING  # at once, not after the execution timeout
    assert not Runner.objects.filter(id=runner_id).exists()
    assert log_manifest(run) == {"count": 0, "sha256": [], "lost": True}  # flushed: it never pushed a line


def test_it_refuses_before_the_gate_and_says_when_it_becomes_eligible(
    owner_api: APIClient, stack: Stack, group: RunnerGroup
) -> None:
    run, runner_id = accepted(stack, group, _ago(1))
    seen = Runner.objects.get(id=runner_id).last_seen_at
    assert seen is not None
    before = world()

    response = owner_api.post(_url(runner_id))

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "runner_not_offline"
    eligible = seen + timedelta(minutes=5)
    assert body["eligible_at"] == eligible.isoformat()
    assert f"last seen at {seen.isoformat()}" in body["detail"]
    assert f"from {eligible.isoformat()}" in body["detail"]
    assert "GANTRY_RUNNER_FORCE_GATE" in body["detail"]
    assert world() == before
    assert log_manifest(run) is None


def test_it_counts_a_runner_that_never_polled_as_offline_since_its_creation(
    owner_api: APIClient, stack: Stack, group: RunnerGroup
) -> None:
    run = deploy(stack, now=_ago(20))
    c = claim_at(group, _ago(20))  # a stub that never came up
    services.run_reset_lease(run_id=run.id, now=_ago(14))

    assert owner_api.post(_url(c.runner_id)).status_code == 204

    # A run it was only assigned is not failed: it goes back to dispatch.
    assert claimable(run)
    assert not RunEvent.objects.filter(run=run, kind="force_deleted").exists()


def test_it_is_for_the_runner_orgs_admins_only(
    outsider_api: APIClient, teammate_api: APIClient, anon: APIClient, stack: Stack, group: RunnerGroup
) -> None:
    run, runner_id = accepted(stack, group, _ago(20))
    runner_api = APIClient()
    runner_token = tokens.mint_runner_token(runner_id=runner_id, run_id=run.id, group_id=group.id)
    runner_api.credentials(HTTP_AUTHORIZATION=f"Bearer {runner_token}")

    assert outsider_api.post(_url(runner_id)).status_code == 404  # another org's runner does not exist for them
    assert teammate_api.post(_url(runner_id)).status_code == 403
    assert anon.post(_url(runner_id)).status_code == 401
    assert runner_api.post(_url(runner_id)).status_code == 403
    assert reload(run).status == RunStatus.RUNNING
    assert Runner.objects.filter(id=runner_id).exists()


def test_it_answers_404_for_an_unknown_runner(owner_api: APIClient) -> None:
    response = owner_api.post(_url(uuid.uuid4()))
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert not Run.objects.exists()
