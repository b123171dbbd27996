"""Inactive runners (DeleteInactive): stubs past the stub cutoff; busy runners silent past the execution timeout."""

from __future__ import annotations

import gzip
from datetime import timedelta
from pathlib import Path

from django.test import override_settings

from gantry.core import services
from gantry.core.models import DeploymentStatus, Run, Runner, RunnerGroup, RunStatus, Stack
from gantry.logs import live
from gantry.reapers.reapers import inactive_runners
from tests.core.drive import deployment_status, new_runner

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
    world,
)


def _count(group: RunnerGroup) -> int:
    return RunnerGroup.objects.values_list("runner_count", flat=True).get(id=group.id)


# ---------------------------------------------------------------- stubs


def test_it_deletes_a_not_ready_stub_past_the_cutoff_and_frees_its_run(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    c = claim_at(group, T0)
    services.run_reset_lease(run_id=run.id, now=after(T0, "assignment_ttl", 1))
    assert not claimable(run)  # the stub may still be booting

    assert inactive_runners(now=after(T0, "stub_cutoff", -1)).counts["stub_deleted"] == 0
    result = inactive_runners(now=after(T0, "stub_cutoff", 1))

    assert result.counts["stub_deleted"] == 1
    assert not Runner.objects.filter(id=c.runner_id).exists()
    assert claimable(run)  # the foreign key released it
    assert _count(group) == 0  # and the group's slot is free
    # No transition, no event: a vanished stub usually means a successful re-queue.
    assert event_kinds(run) == ["created", "assigned", "lease_expired"]


def test_it_ages_a_ready_stub_from_its_creation(stack: Stack, group: RunnerGroup) -> None:
    deploy(stack, now=T0)
    c = claim_at(group, T0)
    # Ready just before the cutoff: it still cannot accept (its lease lapsed long ago).
    services.runner_ready(runner_id=c.runner_id, now=after(T0, "stub_cutoff", -5))

    result = inactive_runners(now=after(T0, "stub_cutoff", 1))

    assert result.counts["stub_deleted"] == 1
    assert not Runner.objects.filter(id=c.runner_id).exists()


def test_it_keeps_a_stub_that_still_holds_a_run(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    old = new_runner(group)  # created now (DB time), long before the assignment below
    Runner.objects.filter(id=old.id).update(created_at=at(-3600))
    services.run_assign(run_id=run.id, runner=old, now=T0)  # a live lease
    before = world()

    assert inactive_runners(now=at(1)).acted == 0
    assert world() == before


def test_it_pages_past_a_stub_it_keeps(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    holder = new_runner(group)
    Runner.objects.filter(id=holder.id).update(created_at=at(-3600))  # the oldest stub, but it holds a run
    services.run_assign(run_id=run.id, runner=holder, now=T0)
    other = services.stack_create(org=stack.organization, name="other", labels=stack.labels, spec=stack.spec)
    deploy(other, now=at(-1000))
    gone = claim_at(group, at(-1000))

    result = inactive_runners(now=at(1), batch_size=1)

    assert result.counts["stub_deleted"] == 1
    assert Runner.objects.filter(id=holder.id).exists()
    assert not Runner.objects.filter(id=gone.runner_id).exists()


def test_it_keeps_stubs_and_busy_runners_before_their_time(stack: Stack, group: RunnerGroup) -> None:
    deploy(stack, now=T0)
    claim_at(group, T0)
    other = services.stack_create(org=stack.organization, name="other", labels=stack.labels, spec=stack.spec)
    accepted(other, group, T0)
    before = world()

    assert inactive_runners(now=after(T0, "stub_cutoff", -1)).acted == 0
    assert world() == before


# ---------------------------------------------------------------- busy runners


def test_it_fails_the_run_of_a_silent_busy_runner_and_deletes_it(stack: Stack, group: RunnerGroup) -> None:
    run, runner_id = accepted(stack, group, T0)
    queued = deploy(stack, now=at(5))
    seen = at(60)
    heartbeat(runner_id=runner_id, run_id=run.id, now=seen)

    assert inactive_runners(now=after(seen, "runner_execution_timeout", -1)).acted == 0
    result = inactive_runners(now=after(seen, "runner_execution_timeout", 1))

    assert (result.counts["runner_lost"], result.counts["runner_deleted"]) == (1, 1)
    row = reload(run)
    assert row.status == RunStatus.FAILURE
    assert row.failure_reason.startswith("runner lost")
    assert deployment_status(row) == DeploymentStatus.FAILED
    assert event_kinds(run)[-1] == "runner_lost"
    assert reload(queued).status == RunStatus.PENDING  # the lane moved on
    assert log_manifest(run) == {"count": 0, "sha256": [], "lost": True}  # flushed: it never pushed a line
    assert not Runner.objects.filter(id=runner_id).exists()
    assert _count(group) == 0


def test_it_spares_a_runner_that_keeps_polling(stack: Stack, group: RunnerGroup) -> None:
    run, runner_id = accepted(stack, group, T0)
    heartbeat(runner_id=runner_id, run_id=run.id, now=at(minutes=200))

    assert inactive_runners(now=at(minutes=210)).acted == 0
    assert reload(run).status == RunStatus.RUNNING
    assert log_manifest(run) is None


def test_it_rechecks_silence_on_the_locked_runner(stack: Stack, group: RunnerGroup) -> None:
    # The sweep selected the runner as silent, but a /status landed before the failure.
    run, runner_id = accepted(stack, group, T0)
    heartbeat(runner_id=runner_id, run_id=run.id, now=at(minutes=59))

    assert services.runner_fail_lost(runner_id=runner_id, silent_before=at(minutes=30), now=at(minutes=61)) is None
    assert reload(run).status == RunStatus.RUNNING


def test_it_deletes_a_busy_runner_whose_run_finished_without_a_deregister(stack: Stack, group: RunnerGroup) -> None:
    run, runner_id = accepted(stack, group, T0)
    services.run_finish(run_id=run.id, outcome="succeeded", exit_code=0, runner_id=runner_id, now=at(30))
    events = event_kinds(run)

    result = inactive_runners(now=after(T0, "runner_execution_timeout", 10))

    assert (result.counts["runner_lost"], result.counts["runner_deleted"]) == (0, 1)
    assert reload(run).status == RunStatus.SUCCEEDED
    assert event_kinds(run) == events
    assert not Runner.objects.filter(id=runner_id).exists()


def test_it_keeps_the_runner_and_the_live_log_for_the_next_sweep_when_the_flush_fails(
    stack: Stack, group: RunnerGroup, log_dir: Path, tmp_path: Path
) -> None:
    run, runner_id = accepted(stack, group, T0)
    assert live.store(run.id, chunk_index=0, sealed_chunks=0, data=gzip.compress(b"last words"))
    later = after(T0, "runner_execution_timeout", 10)
    broken = tmp_path / "not-a-folder"
    broken.write_text("storage is down")  # the local store cannot make its folders under a file

    with override_settings(GANTRY_LOG_DIR=str(broken)):
        first = inactive_runners(now=later)

    assert (first.counts["runner_lost"], first.counts["flush_failed"], first.counts["runner_deleted"]) == (1, 1, 0)
    assert reload(run).status == RunStatus.FAILURE
    assert Runner.objects.filter(id=runner_id, status="busy").exists()
    assert log_manifest(run) is None
    assert live.get(run.id) is not None  # nothing lost: the record waits for the retry

    second = inactive_runners(now=later + timedelta(minutes=1))

    assert (second.counts["runner_lost"], second.counts["runner_deleted"]) == (0, 1)
    manifest = log_manifest(run)
    assert manifest is not None
    assert manifest["count"] == 1
    assert manifest["flushed_chunk"] == 0
    assert gzip.decompress((log_dir / f"runs/{run.id}/chunks/00000000.gz").read_bytes()) == b"last words"
    assert live.get(run.id) is None
    assert event_kinds(run).count("runner_lost") == 1


def test_it_flushes_the_live_log_to_storage_as_the_final_chunk(
    stack: Stack, group: RunnerGroup, tmp_path: Path
) -> None:
    # gantry.logs.flush_live_logs, with local log storage.
    run, _ = accepted(stack, group, T0)
    with override_settings(GANTRY_LOG_DIR=str(tmp_path), GANTRY_S3_BUCKET=""):
        assert live.store(run.id, chunk_index=0, sealed_chunks=0, data=gzip.compress(b"last words"))

        inactive_runners(now=after(T0, "runner_execution_timeout", 10))

    manifest = Run.objects.values_list("log_manifest", flat=True).get(id=run.id)
    assert manifest is not None
    assert manifest["count"] == 1
    assert live.get(run.id) is None


def test_it_is_idempotent(stack: Stack, group: RunnerGroup) -> None:
    deploy(stack, now=T0)
    claim_at(group, T0)
    other = services.stack_create(org=stack.organization, name="other", labels=stack.labels, spec=stack.spec)
    accepted(other, group, T0)
    later = after(T0, "runner_execution_timeout", 10)
    first = inactive_runners(now=later)
    assert (first.counts["stub_deleted"], first.counts["runner_lost"]) == (1, 1)
    before = world()

    assert inactive_runners(now=later).acted == 0
    assert world() == before
