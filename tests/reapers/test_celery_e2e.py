"""``celery -A gantry worker -B`` with the README's settings runs the beat schedule against real Redis.

A real worker with embedded beat is started on this test's database (its
rows are committed: ``transaction=True``) with ``GANTRY_REAPER_INTERVAL=2``
and a queue of its own on the machine's Redis, so other test runs sharing
that Redis never take its tasks. The test waits (a bounded poll) for an
expired assignment to be reset by a scheduled sweep, then for the worker's
figures to show at this process's /metrics.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from gantry.core.models import RunnerGroup, RunStatus, Stack
from tests.childdb import database_url

from .helpers import claim_at, deploy, reload
from .test_metrics import value

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).parent / "celery"


def _wait(cond: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    raise AssertionError(f"{what} did not happen within {timeout} s; worker log:\n{tail}")


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Path]:
    """The README's command, on this test's database; answers the path of its log."""
    assert CELERY.exists(), f"the celery command is missing from the virtualenv ({CELERY})"
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "GANTRY_REAPER_INTERVAL": "2",
        "GANTRY_CELERY_QUEUE": f"gantry-test-{uuid.uuid4().hex[:12]}",
    }
    cmd = [str(CELERY), "-A", "gantry", "worker", "-B", "--loglevel", "INFO", "--concurrency", "1",
           "--schedule", str(tmp_path / "celerybeat-schedule")]  # fmt: skip
    with log.open("wb") as out:
        # Its own session, so the worker's children (pool, embedded beat) stop with it.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield log
    finally:
        proc.send_signal(signal.SIGTERM)  # warm shutdown: the current sweep finishes
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        # The pool and beat children share the session; none may outlive the test's database.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_it_runs_the_beat_schedule_in_a_worker(stack: Stack, group: RunnerGroup, worker: Path) -> None:
    before = Client().get("/metrics").content.decode()
    then = timezone.now() - timedelta(minutes=6)
    run = deploy(stack, now=then)
    claim_at(group, then)  # its lease lapsed a minute ago; its stub is not due yet

    _wait(lambda: reload(run).status == RunStatus.PENDING, 60, "a scheduled sweep resetting the lease", worker)

    reset = {"reaper": "expired_assignments", "outcome": "reset"}

    def counted() -> bool:
        text = Client().get("/metrics").content.decode()
        return value(text, "gantry_reaper_reaped_total", **reset) > value(before, "gantry_reaper_reaped_total", **reset)

    _wait(counted, 10, "the worker's sweep showing at /metrics", worker)
    assert "gantry.reapers.expired_assignments" in worker.read_text(errors="replace")
