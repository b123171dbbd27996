"""Retention: finished runs past GANTRY_RETENTION_DAYS go with their events, log chunks and Redis records.

Never a run that is not terminal, never a deployment's newest run (the
deployment keeps its final status), nothing at all with 0 days. Storage is
the real local store, or S3 on the moto server; Redis is real.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from gantry import conf
from gantry.core import services
from gantry.core.models import DeploymentStatus, LogPurge, Run, RunEvent, RunnerGroup, RunStatus, RunToken, Stack
from gantry.logs import live
from gantry.logs.reader import INDEX_KEY
from gantry.logs.storage import get_storage
from gantry.reapers.reapers import retention
from gantry.redis import client as redis_client
from tests.core.drive import deployment_status, newest_run
from tests.logs.conftest import moto_endpoint, s3  # noqa: F401 (fixtures)

from .helpers import T0, accepted, at, event_kinds

DAYS = 30


@pytest.fixture
def retention_days(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set GANTRY_RETENTION_DAYS for the test (30 unless it calls the answer with another value)."""

    def set_days(days: int) -> None:
        monkeypatch.setenv("GANTRY_RETENTION_DAYS", str(days))
        conf.get.cache_clear()

    set_days(DAYS)
    yield set_days
    monkeypatch.undo()
    conf.get.cache_clear()


def _started_and_failed(stack: Stack, group: RunnerGroup, when: datetime) -> Run:
    """A run accepted at ``when``, with a stored chunk, a live record and a chunk index; failed a minute later."""
    run, runner_id = accepted(stack, group, when)
    get_storage().put(run.id, 0, gzip.compress(b"old output"))
    live.store(run.id, chunk_index=1, sealed_chunks=1, data=gzip.compress(b"old tail"))
    redis_client().hset(INDEX_KEY.format(run_id=run.id), "0", "x")
    services.run_finish(
        run_id=run.id, outcome="failure", exit_code=1, runner_id=runner_id, now=when + timedelta(minutes=1)
    )
    services.runner_deregister(runner_id=runner_id, now=when + timedelta(minutes=1))
    return Run.objects.get(id=run.id)


def _retried(run: Run, when: datetime) -> Run:
    """A second attempt of ``run``'s deployment at ``when``, timed out at once (never started): its newest run."""
    services.deployment_retry(deployment_id=run.deployment_id, now=when)
    retry = newest_run(run.deployment_id)
    services.run_startup_timeout(run_id=retry.id, now=when)
    return Run.objects.get(id=retry.id)


def _gone(run: Run, log_dir: Path) -> bool:
    """Nothing of ``run`` is left: row, events, token, stored chunks, Redis records."""
    r = redis_client()
    return (
        not Run.objects.filter(id=run.id).exists()
        and not RunEvent.objects.filter(run_id=run.id).exists()
        and not RunToken.objects.filter(run_id=run.id).exists()
        and not (log_dir / "runs" / str(run.id)).exists()
        and not r.exists(live.KEY.format(run_id=run.id), INDEX_KEY.format(run_id=run.id))
    )


def test_it_removes_a_superseded_run_past_retention_and_everything_it_left(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any
) -> None:
    old = _started_and_failed(stack, group, T0)
    newest = _retried(old, at(minutes=10))
    events = RunEvent.objects.filter(run_id=old.id).count()
    assert (log_dir / "runs" / str(old.id) / "chunks" / "00000000.gz").exists()
    assert RunToken.objects.filter(run_id=old.id).exists()

    assert retention(now=T0 + timedelta(days=DAYS)).acted == 0  # finished 29 days 23 hours ago: kept
    result = retention(now=T0 + timedelta(days=DAYS, hours=1))

    assert result.counts["run_deleted"] == 1
    assert result.counts["event_deleted"] == events > 0
    assert result.counts["log_purged"] == 1
    assert _gone(old, log_dir)
    assert not LogPurge.objects.exists()
    # The deployment keeps its newest run, that run's events, and its final status.
    assert Run.objects.filter(id=newest.id).exists()
    assert event_kinds(newest)[-1] == "startup_timeout"
    assert deployment_status(newest) == DeploymentStatus.FAILED


def test_it_never_removes_a_deployments_newest_run(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any
) -> None:
    only = _started_and_failed(stack, group, T0)
    events = event_kinds(only)

    assert retention(now=T0 + timedelta(days=10 * DAYS)).acted == 0

    assert event_kinds(only) == events
    assert (log_dir / "runs" / str(only.id) / "chunks" / "00000000.gz").exists()
    assert deployment_status(only) == DeploymentStatus.FAILED


def test_it_never_removes_a_run_that_is_not_terminal(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any
) -> None:
    old = _started_and_failed(stack, group, T0)
    _retried(old, at(minutes=10))
    # A hand-made row: live, yet carrying an old finished_at (no service writes that).
    with connection.cursor() as cur:
        cur.execute("UPDATE run SET status = 'running' WHERE id = %s", [old.id])

    assert retention(now=T0 + timedelta(days=10 * DAYS)).acted == 0
    assert Run.objects.filter(id=old.id, status=RunStatus.RUNNING).exists()


def test_zero_days_keeps_everything_for_ever(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any
) -> None:
    retention_days(0)
    old = _started_and_failed(stack, group, T0)
    _retried(old, at(minutes=10))

    assert retention(now=T0 + timedelta(days=36_500)).acted == 0
    assert Run.objects.filter(id=old.id).exists()
    assert (log_dir / "runs" / str(old.id)).exists()


def test_it_is_bounded_per_tick_and_goes_on_where_it_stopped(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any
) -> None:
    deployments = []
    for i in range(5):
        other = services.stack_create(org=stack.organization, name=f"s{i}", labels=stack.labels, spec=stack.spec)
        old = _started_and_failed(other, group, at(minutes=i))
        deployments.append((old, _retried(old, at(minutes=10 + i))))
    later = T0 + timedelta(days=DAYS + 1)

    # Each tick examines at most 4 finished runs (old and newest alike, oldest first).
    ticks = [retention(now=later, batch_size=2, max_rows=4).counts["run_deleted"] for _ in range(4)]

    assert ticks == [4, 1, 0, 0]
    for old, newest in deployments:
        assert _gone(old, log_dir)
        assert Run.objects.filter(id=newest.id).exists()


def test_a_failed_storage_delete_is_retried_and_never_leaves_a_row_naming_missing_chunks(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any
) -> None:
    old = _started_and_failed(stack, group, T0)
    _retried(old, at(minutes=10))
    folder = log_dir / "runs" / str(old.id)
    blocker = folder.parent / (folder.name + ".moved")
    folder.rename(blocker)
    folder.write_text("not a folder: the delete fails")

    first = retention(now=T0 + timedelta(days=DAYS + 1))

    assert (first.counts["run_deleted"], first.counts["log_purged"], first.counts["purge_failed"]) == (1, 0, 1)
    assert not Run.objects.filter(id=old.id).exists()  # the row went first: nothing names the chunks any more
    assert LogPurge.objects.filter(run_id=old.id).exists()  # and the outbox remembers them

    folder.unlink()
    blocker.rename(folder)
    second = retention(now=T0 + timedelta(days=DAYS + 1, minutes=1))

    assert (second.counts["log_purged"], second.counts["purge_failed"]) == (1, 0)
    assert _gone(old, log_dir)
    assert not LogPurge.objects.exists()


def test_it_deletes_the_chunks_from_s3_in_batches(
    s3: Any,  # noqa: F811 (the fixture)
    stack: Stack,
    group: RunnerGroup,
    log_dir: Path,
    retention_days: Any,
) -> None:
    old = _started_and_failed(stack, group, T0)
    for n in range(1, 4):
        get_storage().put(old.id, n, gzip.compress(f"chunk {n}".encode()))
    newest = _retried(old, at(minutes=10))
    kept = _started_and_failed(
        services.stack_create(org=stack.organization, name="kept", labels=stack.labels, spec=stack.spec), group, T0
    )

    def keys(run: Run) -> list[str]:
        answer = s3.list_objects_v2(Bucket="gantry-logs", Prefix=f"runs/{run.id}/")
        return [item["Key"] for item in answer.get("Contents", ())]

    assert len(keys(old)) == 4

    result = retention(now=T0 + timedelta(days=DAYS + 1))

    assert (result.counts["run_deleted"], result.counts["log_purged"]) == (1, 1)
    assert keys(old) == []
    assert len(keys(kept)) == 1  # a newest run's chunks stay
    assert Run.objects.filter(id=newest.id).exists()
