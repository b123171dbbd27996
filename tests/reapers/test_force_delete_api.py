"""POST /api/v1/runners/{runner_id}/force-delete: org admins, once the runner is offline past the force gate."""

from __future__ import annotations

import gzip
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import LogFlush, Run, RunEvent, Runner, RunnerGroup, RunStatus, Stack
from gantry.logs import live
from gantry.reapers.reapers import inactive_runners

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
    assert not LogFlush.objects.exists()  # flushed at once: nothing left queued


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
    # A sentence for a person: UTC to the second, the gate in words (no microseconds, no "+00:00").
    assert f"last seen at {seen.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" in body["detail"]
    assert f"from {eligible.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" in body["detail"]
    assert "offline for 5 min (" in body["detail"]
    assert "." not in body["detail"].split("last seen at ")[1].split(";")[0]
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


def test_a_flush_that_fails_at_the_force_delete_is_retried_by_the_inactive_runner_reaper(
    owner_api: APIClient, stack: Stack, group: RunnerGroup, log_dir: Path, tmp_path: Path
) -> None:
    run, runner_id = accepted(stack, group, _ago(20))
    assert live.store(run.id, chunk_index=0, sealed_chunks=0, data=gzip.compress(b"last words"))
    broken = tmp_path / "not-a-folder"
    broken.write_text("storage is down")  # the local store cannot make its folders under a file

    with override_settings(GANTRY_LOG_DIR=str(broken)):
        assert owner_api.post(_url(runner_id)).status_code == 204
        # The runner row is gone; the queued flush is what keeps the log from being lost.
        assert not Runner.objects.filter(id=runner_id).exists()
        assert reload(run).status == RunStatus.FAILURE
        assert log_manifest(run) is None
        assert live.get(run.id) is not None
        assert LogFlush.objects.filter(run_id=run.id).exists()
        still_down = inactive_runners(now=timezone.now())
    assert (still_down.counts["flush_failed"], still_down.counts["log_flushed"]) == (1, 0)
    assert LogFlush.objects.filter(run_id=run.id).exists()

    result = inactive_runners(now=timezone.now())  # storage back

    assert (result.counts["flush_failed"], result.counts["log_flushed"]) == (0, 1)
    assert not LogFlush.objects.exists()
    manifest = log_manifest(run)
    assert manifest is not None
    assert manifest["count"] == 1
    assert gzip.decompress((log_dir / f"runs/{run.id}/chunks/00000000.gz").read_bytes()) == b"last words"
    assert live.get(run.id) is None


def test_a_queued_flush_whose_run_is_gone_is_dropped(stack: Stack, group: RunnerGroup) -> None:
    # Retention deleted the run (set-based) before the flush landed: nothing is left to flush.
    LogFlush.objects.create(run_id=uuid.uuid4(), queued_at=timezone.now())

    result = inactive_runners(now=timezone.now())

    assert (result.counts["flush_failed"], result.counts["log_flushed"], result.counts["error"]) == (0, 0, 0)
    assert not LogFlush.objects.exists()
