"""Two sweeps racing on the same rows from two connections: every row transitions once, one event each.

Each sweep runs in its own thread with its own database connection; the
threads meet at a ``threading.Barrier`` so they overlap. ``sweeps`` runs the
real reaper twice at once (the second beat, or a manual ``reap`` beside it);
``same_rows`` also hands both the same selection, so every row is attempted
twice and only the set-based UPDATEs' guards (and their SKIP LOCKED) keep it
to one transition. Lanes freed by the race are promoted once, and a lost
run's live log is flushed to storage once.
"""

from __future__ import annotations

import gzip
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from django.db import connection

from gantry.core import services
from gantry.core.models import Organization, Run, RunEvent, Runner, RunnerGroup, Stack
from gantry.logs import live
from gantry.reapers import reapers
from gantry.reapers.reapers import SweepResult
from gantry.sql import reapers as reaper_sql
from tests.conftest import SPEC

from .helpers import T0, accepted, after, at, claim_at, deploy, log_manifest, stuck_in_requested_cancellation

pytestmark = pytest.mark.django_db(transaction=True)

N = 20


def race(sweep: Callable[[], SweepResult]) -> list[SweepResult]:
    barrier = threading.Barrier(2, timeout=30)
    results: list[SweepResult | None] = [None, None]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = sweep()
        except BaseException as exc:  # judged below
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a sweep hung"
    assert not errors, errors
    done = [r for r in results if r is not None]
    assert len(done) == 2
    assert sum(r.counts["error"] for r in done) == 0
    return done


def total(results: list[SweepResult], outcome: str) -> int:
    return sum(r.counts[outcome] for r in results)


def one_event_each(runs: list[Run], kind: str) -> None:
    per_run = Counter(RunEvent.objects.filter(run__in=runs, kind=kind).values_list("run_id", flat=True))
    assert per_run == dict.fromkeys((r.id for r in runs), 1)


@pytest.fixture
def org() -> Organization:
    return services.org_create(slug="race", name="Race")


@pytest.fixture
def big_group(org: Organization) -> RunnerGroup:
    group, _ = services.runner_group_create(org=org, name="big", labels={"os": "linux"}, max_concurrent_runs=4 * N)
    return group


def stacks(org: Organization, n: int = N, prefix: str = "s") -> list[Stack]:
    labels = {"gantry:runner-group:os": "linux"}
    return [services.stack_create(org=org, name=f"{prefix}{i}", labels=labels, spec=SPEC) for i in range(n)]


class Mode:
    """How the two sweeps race; ``prepare`` runs before the race."""

    def __init__(self, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.same_rows = name == "same_rows"
        self._monkeypatch = monkeypatch

    def prepare(self, sql: str, params: dict[str, Any]) -> None:
        """In ``same_rows`` mode, select the due rows once, now, and hand both sweeps that selection."""
        if not self.same_rows:
            return
        batches = list(reapers._due(sql, params, batch_size=reapers.BATCH_SIZE, max_rows=reapers.MAX_ROWS))
        assert sum(len(batch) for batch in batches) == N

        def same(sql: str, params: dict[str, Any], **kw: Any) -> Iterator[list[uuid.UUID]]:
            return iter(batches)

        self._monkeypatch.setattr(reapers, "_due", same)


@pytest.fixture(params=["sweeps", "same_rows"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Mode:
    return Mode(request.param, monkeypatch)


def _ago(knob: str, now: datetime) -> datetime:
    """``now`` minus the knob's duration: the reaper's own cut-off."""
    return now - (after(T0, knob) - T0)


def test_it_resets_each_expired_assignment_once(org: Organization, big_group: RunnerGroup, mode: Mode) -> None:
    runs = [deploy(s, now=T0) for s in stacks(org)]
    for _ in runs:
        claim_at(big_group, T0)
    now = after(T0, "assignment_ttl", 1)
    mode.prepare(reaper_sql.EXPIRED_ASSIGNMENTS, {"now": now})

    results = race(lambda: reapers.reset_expired_assignments(now=now))

    assert total(results, "reset") == N
    if mode.same_rows:
        assert total(results, "skipped") == N
    one_event_each(runs, "lease_expired")
    assert set(Run.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True)) == {"pending"}


def test_it_times_out_each_run_once_and_promotes_each_lane_once(org: Organization, mode: Mode) -> None:
    lanes = stacks(org)
    runs = [deploy(s, now=T0) for s in lanes]
    queued = [deploy(s, now=at(1)) for s in lanes]
    now = after(T0, "runner_startup_deadline", 1)
    mode.prepare(reaper_sql.STARTUP_DEADLINE, {"now": now, "deadline": _ago("runner_startup_deadline", now)})

    results = race(lambda: reapers.startup_deadline(now=now))

    assert total(results, "timed_out") == N
    one_event_each(runs, "startup_timeout")
    one_event_each(queued, "promoted")
    assert set(Run.objects.filter(id__in=[r.id for r in queued]).values_list("status", flat=True)) == {"pending"}


def test_it_cancels_each_stuck_run_once(org: Organization, mode: Mode) -> None:
    runs = [deploy(s, now=T0) for s in stacks(org)]
    for run in runs:
        stuck_in_requested_cancellation(run)
    now = at(1)
    mode.prepare(reaper_sql.CANCELLATION_BACKSTOP, {"now": now})

    results = race(lambda: reapers.cancellation_backstop(now=now))

    assert total(results, "cancelled") == N
    one_event_each(runs, "cancel_backstop")


def test_it_reaps_each_inactive_runner_once(org: Organization, big_group: RunnerGroup, mode: Mode) -> None:
    lost = [accepted(s, big_group, T0) for s in stacks(org, prefix="busy")]
    for run, _ in lost:
        assert live.store(run.id, chunk_index=2, sealed_chunks=2, data=gzip.compress(f"tail of {run.id}".encode()))
    stubs = []
    for s in stacks(org, prefix="stub"):
        deploy(s, now=T0)
        stubs.append(claim_at(big_group, T0).runner_id)
    now = after(T0, "runner_execution_timeout", 10)
    mode.prepare(reaper_sql.SILENT_RUNNERS, {"silent_before": _ago("runner_execution_timeout", now)})

    results = race(lambda: reapers.inactive_runners(now=now))

    assert total(results, "stub_deleted") == N
    assert total(results, "runner_lost") == N
    assert total(results, "runner_deleted") == N
    one_event_each([run for run, _ in lost], "runner_lost")
    assert not Runner.objects.exists()
    for run, _ in lost:  # each live log flushed once, as chunk 2 of 3
        manifest = log_manifest(run)
        assert manifest is not None
        assert manifest["count"] == 3
        assert manifest["flushed_chunk"] == 2
        assert manifest["sha256"][2] is not None  # the race's loser found the key taken and recorded nothing
        assert live.get(run.id) is None
    assert RunnerGroup.objects.values_list("runner_count", flat=True).get(id=big_group.id) == 0
