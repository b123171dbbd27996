"""The coordinator's reconciler against ``live_server``, with the in-memory fake launcher.

``step()`` drives one reconcile turn and one poll turn in the test's thread;
``run()`` on a thread shows what only the real loop can: the reconciler is
never held up by a parked long poll, and an exit wakes it at once.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gantry.core import services
from gantry.core.models import Run, Runner, RunStatus
from launchers.fake import FakeLauncher
from runners.client import GantryClient
from runners.coordinator import Coordinator, Settings
from tests.runners.conftest import Site, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = Settings(max_parallel=2, wait=1, backoff_base=0.01, backoff_cap=0.05, launch_retry_delay=0, idle_pause=0.01,
                 reconcile_interval=0.2, stop_grace=0)  # fmt: skip
SPEC = {"steps": [{"name": "x", "run": "true"}]}


def coordinator(site: Site, launcher: FakeLauncher, **settings: Any) -> Coordinator:
    merged = Settings(**{**QUICK.__dict__, **settings})
    return Coordinator(GantryClient(site.url, site.group_token, timeout=10), launcher, merged)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def accept(run: Run, runner_id: str) -> None:
    """What the runner would do first: ready, then accept."""
    services.runner_ready(runner_id=uuid.UUID(runner_id))
    services.run_accept(run_id=run.id, runner_id=uuid.UUID(runner_id))


def status(run: Run) -> str:
    return str(Run.objects.values_list("status", flat=True).get(id=run.id))


@pytest.fixture
def running() -> Iterator[list[Coordinator]]:
    """Coordinators a test runs on threads (with :func:`start`): stopped at the end whatever happened."""
    started: list[Coordinator] = []
    yield started
    for coord in started:
        coord.stop()
        coord.reconciler.stop()


def started(site: Site, running: list[Coordinator], **settings: Any) -> tuple[Run, FakeLauncher, Coordinator]:
    """A run, and a coordinator running on a thread that has launched its (fake) worker."""
    run = site.deploy(SPEC)
    fake = FakeLauncher()
    coord = coordinator(site, fake, **settings)
    running.append(coord)
    threading.Thread(target=coord.run, daemon=True).start()
    wait_until(lambda: bool(fake.launched), 30, "the launch")
    return run, fake, coord


def test_a_worker_that_dies_under_its_run_fails_the_run_at_once(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    run = site.deploy(SPEC)
    fake = FakeLauncher()
    coord = coordinator(site, fake)
    coord.step()
    runner_id = fake.launched[0].runner_id
    accept(run, runner_id)

    fake.finish(str(run.id), code=-9)
    coord.step()

    assert status(run) == RunStatus.FAILURE
    assert Run.objects.get(id=run.id).failure_reason.startswith("runner lost: the worker was killed by signal 9")
    assert not Runner.objects.filter(id=runner_id).exists()
    assert coord.workers == {}
    assert coord.reconciler.exits == {}  # settled: not reported again


def test_a_worker_whose_run_was_cancelled_is_stopped_and_then_deregistered(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    run = site.deploy(SPEC)
    fake = FakeLauncher()
    coord = coordinator(site, fake)
    coord.step()
    runner_id = fake.launched[0].runner_id
    services.run_request_cancellation(run_id=run.id)  # before it accepted: cancelled outright

    coord.step()
    wait_until(lambda: fake.worker(str(run.id)).terminated, 10, "terminate")
    coord.step()  # reaps it and reports it exited

    stopping = events(caplog, "worker.stopping")
    assert [(r.run_id, r.reason, r.run_status) for r in stopping] == [(str(run.id), "run_terminal", "cancelled")]  # type: ignore[attr-defined]
    assert coord.workers == {}
    assert not Runner.objects.filter(id=runner_id).exists()
    assert status(run) == RunStatus.CANCELLED


def test_a_failed_report_is_backed_off_and_its_exits_kept(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    run = site.deploy(SPEC)
    fake = FakeLauncher()
    coord = Coordinator(GantryClient(site.url, site.group_token, timeout=10), fake, QUICK,
                        reconcile_client=GantryClient(site.url, "not-a-valid-token", timeout=10))  # fmt: skip
    coord.step()
    accept(run, fake.launched[0].runner_id)
    fake.finish(str(run.id), code=4)

    coord.step()

    assert [r.status for r in events(caplog, "reconcile.backoff")] == [401]  # type: ignore[attr-defined]
    assert list(coord.reconciler.exits) == [str(run.id)]  # kept for the next report
    assert status(run) == RunStatus.RUNNING

    coord.reconciler.client = GantryClient(site.url, site.group_token, timeout=10)  # the token is fixed
    wait_until(lambda: (coord.step(), status(run) == RunStatus.FAILURE)[1], 10, "the kept exit to be reported")
    assert coord.reconciler.exits == {}


def test_the_reconciler_is_not_held_up_by_a_parked_long_poll(site: Site, running: list[Coordinator]) -> None:
    run, _, coord = started(site, running, wait=30)
    # Nothing else to claim: the main loop parks its next poll for 30 s.
    wait_until(lambda: bool(coord.client._inflight), 30, "the long poll to park")

    services.run_request_cancellation(run_id=run.id)
    # Stopped (terminate) and reaped: gone from the coordinator's workers.
    wait_until(lambda: coord.reconciler.stops == 1 and not coord.workers, 20, "the worker to be stopped")

    assert coord.client._inflight, "the long poll was still parked when the worker was stopped"


def test_an_exit_wakes_the_reconciler_before_its_interval(site: Site, running: list[Coordinator]) -> None:
    run, fake, coord = started(site, running, reconcile_interval=300)
    accept(run, fake.launched[0].runner_id)

    fake.finish(str(run.id), code=1)

    # Far sooner than the 300 s interval: the launcher's notice woke the reconciler.
    wait_until(lambda: status(run) == RunStatus.FAILURE, 30, "the exit to be reported")
    assert coord.workers == {}
