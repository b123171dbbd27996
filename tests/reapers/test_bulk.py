"""Set-based sweeps: many due rows over several batches, each moved once, and a stale selection never overwrites.

The stale-selection tests hand a sweep ids selected before a request changed
the rows (``_due`` replaced by that selection), which is what a sweep racing
a request sees: the guarded UPDATE must skip those rows.
"""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from gantry.core import services
from gantry.core.models import DeploymentStatus, Run, RunEvent, Runner, RunnerGroup, RunStatus, Stack
from gantry.logs import live
from gantry.reapers import reapers
from gantry.sql import runs as run_sql
from tests.conftest import SPEC
from tests.core.drive import deployment_status

from .helpers import T0, accepted, after, at, claim_at, deploy, event_kinds, heartbeat, log_manifest, reload

N = 12


def _stacks(stack: Stack, n: int = N) -> list[Stack]:
    return [
        services.stack_create(org=stack.organization, name=f"lane{i}", labels=stack.labels, spec=SPEC) for i in range(n)
    ]


@pytest.fixture
def wide_group(stack: Stack) -> RunnerGroup:
    group, _ = services.runner_group_create(
        org=stack.organization, name="wide", labels={"os": "linux"}, max_concurrent_runs=4 * N
    )
    return group


def _stale(monkeypatch: pytest.MonkeyPatch, ids: list[uuid.UUID]) -> None:
    """The next sweeps get this selection, whatever the rows look like now."""

    def due(sql: str, params: dict[str, Any], **kw: Any) -> Iterator[list[uuid.UUID]]:
        return iter([ids])

    monkeypatch.setattr(reapers, "_due", due)


def test_it_times_out_many_runs_over_several_batches_and_promotes_every_lane(stack: Stack) -> None:
    lanes = _stacks(stack)
    runs = [deploy(s, now=T0) for s in lanes]
    queued = [deploy(s, now=at(1)) for s in lanes]

    result = reapers.startup_deadline(now=after(T0, "runner_startup_deadline", 1), batch_size=5)

    assert (result.counts["timed_out"], result.counts["skipped"]) == (N, 0)
    for run, nxt in zip(runs, queued, strict=True):
        row = reload(run)
        assert row.status == RunStatus.STARTUP_TIMEOUT
        assert row.failure_reason == run_sql.STARTUP_TIMEOUT_REASON
        assert row.finished_at == after(T0, "runner_startup_deadline", 1)
        assert event_kinds(run) == ["created", "startup_timeout"]
        assert deployment_status(row) == DeploymentStatus.FAILED
        assert reload(nxt).status == RunStatus.PENDING
        assert reload(nxt).first_pending_at == row.finished_at
        assert event_kinds(nxt) == ["created", "promoted"]


def test_it_resets_many_leases_and_keeps_the_runner_pointer(stack: Stack, wide_group: RunnerGroup) -> None:
    runs = [deploy(s, now=T0) for s in _stacks(stack)]
    claims = [claim_at(wide_group, T0) for _ in runs]

    result = reapers.reset_expired_assignments(now=after(T0, "assignment_ttl", 1), batch_size=5)

    assert result.counts["reset"] == N
    for c in claims:
        row = Run.objects.get(id=c.run_id)
        assert (row.status, row.assigned_runner_id, row.assigned_expires_at) == (RunStatus.PENDING, c.runner_id, None)
        assert RunEvent.objects.filter(run_id=c.run_id, kind="lease_expired").count() == 1


def test_a_run_that_changed_since_the_selection_is_skipped_not_overwritten(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    lanes = _stacks(stack, 3)
    runs = [deploy(s, now=T0) for s in lanes]
    when = after(T0, "runner_startup_deadline", 1)
    # Selected as due; then a user cancels one before the sweep moves it.
    services.run_request_cancellation(run_id=runs[1].id, now=when - timedelta(seconds=1))
    _stale(monkeypatch, [r.id for r in runs])

    result = reapers.startup_deadline(now=when)

    assert (result.counts["timed_out"], result.counts["skipped"]) == (2, 1)
    assert reload(runs[1]).status == RunStatus.CANCELLED
    assert event_kinds(runs[1]) == ["created", "cancelled"]
    assert [reload(r).status for r in (runs[0], runs[2])] == [RunStatus.STARTUP_TIMEOUT] * 2


def test_a_lease_renewed_since_the_selection_is_not_reset(
    stack: Stack, group: RunnerGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = deploy(stack, now=T0)
    c = claim_at(group, T0)
    _stale(monkeypatch, [run.id])

    # As of a time before the lease lapsed: the guard (not the selection) decides.
    result = reapers.reset_expired_assignments(now=at(10))

    assert (result.counts["reset"], result.counts["skipped"]) == (0, 1)
    assert reload(run).status == RunStatus.ASSIGNED
    assert reload(run).assigned_runner_id == c.runner_id


def test_it_reaps_many_lost_runners_over_several_batches_flushing_every_log(
    stack: Stack, wide_group: RunnerGroup
) -> None:
    lost = [accepted(s, wide_group, T0) for s in _stacks(stack)]
    queued = [deploy(Run.objects.get(id=run.id).stack, now=at(5)) for run, _ in lost]
    for i, (run, _) in enumerate(lost):
        assert live.store(run.id, chunk_index=0, sealed_chunks=0, data=gzip.compress(f"run {i}".encode()))

    result = reapers.inactive_runners(now=after(T0, "runner_execution_timeout", 10), batch_size=5)

    assert (result.counts["runner_lost"], result.counts["runner_deleted"], result.counts["skipped"]) == (N, N, 0)
    assert not Runner.objects.exists()
    for (run, runner_id), nxt in zip(lost, queued, strict=True):
        row = reload(run)
        assert row.status == RunStatus.FAILURE
        assert row.failure_reason.startswith(f"runner lost: runner {runner_id} has not polled")
        assert event_kinds(run)[-1] == "runner_lost"
        assert reload(nxt).status == RunStatus.PENDING
        manifest = log_manifest(run)
        assert manifest is not None
        assert manifest["count"] == 1
        assert live.get(run.id) is None
    assert RunnerGroup.objects.values_list("runner_count", flat=True).get(id=wide_group.id) == 0


def test_a_runner_that_polled_since_the_selection_is_spared(
    stack: Stack, wide_group: RunnerGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    (dead_run, dead), (alive_run, alive) = [accepted(s, wide_group, T0) for s in _stacks(stack, 2)]
    when = after(T0, "runner_execution_timeout", 10)
    heartbeat(runner_id=alive, run_id=alive_run.id, now=when - timedelta(seconds=1))
    _stale(monkeypatch, [dead, alive])

    result = reapers.inactive_runners(now=when)

    assert (result.counts["runner_lost"], result.counts["runner_deleted"], result.counts["skipped"]) == (1, 1, 1)
    assert reload(dead_run).status == RunStatus.FAILURE
    assert reload(alive_run).status == RunStatus.RUNNING
    assert Runner.objects.filter(id=alive).exists()
    assert not Runner.objects.filter(id=dead).exists()
