"""Retention: finished runs past GANTRY_RETENTION_DAYS go with their events, log chunks and Redis records;
finished webhook deliveries go with their run, or once past retention themselves.

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
from django.db.models import F
from django.utils import timezone

from gantry import conf
from gantry.core import services
from gantry.core.models import (
    WEBHOOK_EVENTS,
    DeliveryStatus,
    DeploymentStatus,
    LogPurge,
    Organization,
    Run,
    RunEvent,
    RunnerGroup,
    RunStatus,
    RunToken,
    Stack,
    WebhookDelivery,
    WebhookEndpoint,
)
from gantry.logs import live
from gantry.logs.reader import INDEX_KEY
from gantry.logs.storage import get_storage
from gantry.reapers.reapers import retention
from gantry.redis import client as redis_client
from gantry.webhooks import delivery
from gantry.webhooks import services as webhooks
from tests.core.drive import deployment_status, newest_run
from tests.logs.conftest import moto_endpoint, s3  # noqa: F401 (fixtures)
from tests.webhooks.receiver import Receiver, receiver

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


# ---------------------------------------------------------------- webhook deliveries


@pytest.fixture
def hooks(settings: Any) -> Iterator[tuple[Receiver, Receiver]]:
    """Two real receivers on 127.0.0.1: the first answers 204, the second 500 (its deliveries stay pending)."""
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    with receiver() as ok, receiver() as down:
        down.answers = [500] * 100
        yield ok, down


def _endpoints(org: Organization, *receivers: Receiver) -> list[WebhookEndpoint]:
    return [
        webhooks.endpoint_create(org=org, url=r.url, events=list(WEBHOOK_EVENTS), secret="s3cret-s3cret-s3cret")
        for r in receivers
    ]


def _send_all() -> None:
    """The real sender, once, over every row (the transitions wrote them at T0, in the future: due now by hand)."""
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())
    delivery.deliver_due()


def _finished_a_day_after_written() -> None:
    """Date the finished rows' last attempt a day after their transition, as if the receiver had been down that day.

    (The sender writes the wall clock; the runs live at T0.)
    """
    WebhookDelivery.objects.exclude(status=DeliveryStatus.PENDING).update(
        next_attempt_at=F("created_at") + timedelta(days=1)
    )


def _rows(run: Run, endpoint: WebhookEndpoint) -> int:
    return WebhookDelivery.objects.filter(run_id=run.id, endpoint=endpoint).count()


def test_finished_deliveries_go_with_their_run_then_past_retention_and_pending_ones_stay(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any, hooks: tuple[Receiver, Receiver]
) -> None:
    up, down = _endpoints(stack.organization, *hooks)
    old = _started_and_failed(stack, group, T0)
    newest = _retried(old, at(minutes=10))
    _send_all()
    _finished_a_day_after_written()
    assert not WebhookDelivery.objects.filter(endpoint=up).exclude(status=DeliveryStatus.DELIVERED).exists()
    assert not WebhookDelivery.objects.filter(endpoint=down).exclude(status=DeliveryStatus.PENDING).exists()
    old_up, newest_up, waiting = _rows(old, up), _rows(newest, up), WebhookDelivery.objects.filter(endpoint=down)
    pending = sorted(waiting.values_list("id", flat=True))
    assert (old_up, newest_up) == (4, 3)  # queued, running, failure, deployment.finished; queued, timeout, finished
    assert len(pending) == old_up + newest_up

    # The old run goes, and its delivered rows with it, though they finished within retention; the
    # newest run's (finished within retention) stay, and no pending row goes, whatever its run.
    first = retention(now=T0 + timedelta(days=DAYS, hours=1))

    assert (first.counts["run_deleted"], first.counts["delivery_deleted"]) == (1, old_up)
    assert _rows(old, up) == 0
    assert _rows(newest, up) == newest_up
    assert sorted(waiting.values_list("id", flat=True)) == pending

    # A day later the newest run's deliveries are past retention too; the run itself stays.
    second = retention(now=T0 + timedelta(days=DAYS + 1, hours=1))

    assert (second.counts["run_deleted"], second.counts["delivery_deleted"]) == (0, newest_up)
    assert _rows(newest, up) == 0
    assert Run.objects.filter(id=newest.id).exists()
    assert sorted(waiting.values_list("id", flat=True)) == pending


def test_failed_deliveries_go_past_retention_and_zero_days_keeps_them(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any, hooks: tuple[Receiver, Receiver]
) -> None:
    (down,) = _endpoints(stack.organization, hooks[1])
    only = _started_and_failed(stack, group, T0)
    # Written a day and more before now (the sender gives up on a row a day old): failed at the first answer.
    WebhookDelivery.objects.update(created_at=timezone.now() - timedelta(days=2))
    for _ in range(_rows(only, down)):
        _send_all()  # one row of the run a round: the next waits while an earlier one is pending
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {DeliveryStatus.FAILED}
    _finished_a_day_after_written()
    failed = _rows(only, down)
    later = timezone.now() + timedelta(days=DAYS, hours=1)

    retention_days(0)
    assert retention(now=later).acted == 0
    assert _rows(only, down) == failed

    retention_days(DAYS)
    assert retention(now=later).counts["delivery_deleted"] == failed
    assert Run.objects.filter(id=only.id).exists()  # a deployment's newest run stays


def test_deliveries_are_removed_in_bounded_batches(
    stack: Stack, group: RunnerGroup, log_dir: Path, retention_days: Any, hooks: tuple[Receiver, Receiver]
) -> None:
    _endpoints(stack.organization, hooks[0])
    for i in range(3):
        other = services.stack_create(org=stack.organization, name=f"s{i}", labels=stack.labels, spec=stack.spec)
        _started_and_failed(other, group, at(minutes=i))
    _send_all()
    _finished_a_day_after_written()
    assert WebhookDelivery.objects.count() == 12  # queued, running, failure, deployment.finished of each
    later = T0 + timedelta(days=DAYS + 2)

    ticks = [retention(now=later, batch_size=2, max_rows=5).counts["delivery_deleted"] for _ in range(4)]

    assert ticks == [5, 5, 2, 0]
    assert not WebhookDelivery.objects.exists()
