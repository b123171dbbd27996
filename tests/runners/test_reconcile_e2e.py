"""The coordinator reconciling its workers with Gantry, end to end: a real ``python -m runners.coordinator``
process against ``live_server``, launching the real ephemeral runner.

The launcher is a parameter (:class:`LauncherCase`): each case says how the
coordinator is told to use it and how to make a worker slow to start. Only
``local`` is here; another launcher joins by adding a case.

Waits are bounded polls of what can be observed. The latencies the issue
asks for (kill → failed, cancel → stopped) are measured and printed (run with
``-s``), not asserted: the assertions prove the path instead (the run failed
through the reconcile, ``runner_exited``, not through a reaper).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gantry.core import services
from gantry.core.models import Run, RunEvent, Runner, RunStatus
from gantry_wire import procfs
from runners.client import GantryClient
from tests.runners.conftest import ROOT, Site, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

INTERVAL = 1.0  # --reconcile-interval for these tests


@dataclass
class LauncherCase:
    """How a test drives one launcher kind through the coordinator's command line."""

    kind: str
    # (folder for its files, seconds the runner should wait before it starts) → --launcher-option values
    options: Callable[[Path, float], list[str]]
    # SIGKILL the runner of a worker, by its ident (``worker`` in worker.launched)
    kill_runner: Callable[[str], None]
    # After the test: remove whatever the coordinator on this state folder left running
    cleanup: Callable[[Path], None]


def _local_options(folder: Path, start_delay: float) -> list[str]:
    if not start_delay:
        return []
    # A runner that is slow to start: the interpreter is a shim that waits first.
    shim = folder / "slow-python"
    shim.write_text(f'#!/bin/sh\nsleep {start_delay:g}\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    return [f"python={shim}"]


def _local_kill(ident: str) -> None:
    os.kill(int(ident), signal.SIGKILL)  # the local launcher's worker is its runner's pid


def _local_cleanup(state_dir: Path) -> None:
    """SIGKILL every process in the sessions of the workers the local launcher recorded."""
    for record in (state_dir / "workers").glob("*.json") if (state_dir / "workers").is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            sid = int(json.loads(record.read_text())["pid"])
            for pid in procfs.members(procfs.SESSION, sid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


LAUNCHERS = {"local": LauncherCase("local", _local_options, _local_kill, _local_cleanup)}


@pytest.fixture(params=sorted(LAUNCHERS))
def launcher_case(request: pytest.FixtureRequest) -> LauncherCase:
    return LAUNCHERS[request.param]


@dataclass
class CoordinatorProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    state_dir: Path
    token: str = field(repr=False)
    name: str
    start_delay: float

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines() if self.log.exists() else []:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if name is None or record.get("event") == name:
                    found.append(record)
        return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@dataclass
class Coordinators:
    site: Site
    case: LauncherCase
    started: list[CoordinatorProcess] = field(default_factory=list)

    def restart(self, old: CoordinatorProcess) -> CoordinatorProcess:
        """A new coordinator process on ``old``'s state folder (``old`` has exited)."""
        assert old.proc.poll() is not None
        return self.start(old.token, old.name, start_delay=old.start_delay, again=True)

    def start(
        self, token: str, name: str = "a", *, start_delay: float = 0, again: bool = False, interval: float = INTERVAL
    ) -> CoordinatorProcess:
        folder = self.site.tmp / f"coordinator-{name}"
        folder.mkdir(exist_ok=again)
        options = [arg for opt in self.case.options(folder, start_delay) for arg in ("--launcher-option", opt)]
        log = folder / f"coordinator-{len(self.started)}.log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONPATH": str(ROOT),
            "GANTRY_GROUP_TOKEN": token,
            "GANTRY_STOP_GRACE": "2",
        }
        argv = [sys.executable, "-m", "runners.coordinator", "--server", self.site.url, "--launcher", self.case.kind,
                *options, "--state-dir", str(folder / "state"), "--max-parallel", "2", "--wait", "5",
                "--reconcile-interval", f"{interval:g}"]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        started = CoordinatorProcess(proc, log, folder / "state", token, name, start_delay)
        self.started.append(started)
        wait_until(
            lambda: bool(started.events("coordinator.started")) or proc.poll() is not None, 30, "the coordinator"
        )
        assert proc.poll() is None, log.read_text()
        return started


@pytest.fixture
def coordinators(site: Site, launcher_case: LauncherCase) -> Iterator[Coordinators]:
    started = Coordinators(site, launcher_case)
    yield started
    for c in started.started:
        c.stop()
        launcher_case.cleanup(c.state_dir)


def user_api(site: Site) -> GantryClient:
    return GantryClient(site.url, site.user_token, scheme="Token", timeout=30)


def status(run: Run) -> str:
    return str(Run.objects.values_list("status", flat=True).get(id=run.id))


def log_text(site: Site, run: Run) -> str:
    return str(user_api(site).run_logs(str(run.id))["text"])


# ---------------------------------------------------------------- a runner killed under its run


def test_a_runner_killed_mid_run_fails_its_run_at_once_with_its_log_and_the_lane_moves_on(
    site: Site, coordinators: Coordinators
) -> None:
    killed_at = site.tmp / "killed-at"
    step = f"echo before-the-kill; sleep 2; date +%s.%N > {killed_at}; kill -KILL $PPID; sleep 60; echo never"
    doomed = site.deploy({"steps": [{"name": "doomed", "run": step}]})
    following = site.deploy({"steps": [{"name": "next", "run": "echo the next run"}]})
    assert status(following) == RunStatus.QUEUED
    # The default interval: an exit is reported when it happens, not at the next turn.
    coordinator = coordinators.start(site.group_token, interval=5)
    wait_until(lambda: status(doomed) in (RunStatus.RUNNING, RunStatus.FAILURE), 60, "the run to start")
    runner_id = Run.objects.get(id=doomed.id).assigned_runner_id

    wait_until(lambda: status(doomed) == RunStatus.FAILURE, 120, "the killed runner's run to fail")

    run = Run.objects.get(id=doomed.id)
    latency = run.finished_at.timestamp() - float(killed_at.read_text())  # type: ignore[union-attr]
    print(f"\n[reconcile] kill -> run failed: {latency:.3f} s (--reconcile-interval 5)")
    assert run.failure_reason.startswith("runner lost: the worker was killed by signal 9 after ")
    assert list(RunEvent.objects.filter(run_id=run.id, kind="runner_exited").values_list("kind", flat=True)) == [
        "runner_exited"
    ]
    assert runner_id is not None
    # Deleted once the log is flushed (the same report, just after the run failed).
    wait_until(lambda: not Runner.objects.filter(id=runner_id).exists(), 30, "the runner row to go")
    assert "before-the-kill" in log_text(site, run)  # the live log became the final chunk
    assert "never" not in log_text(site, run)
    exited = [e for e in coordinator.events("worker.exited") if e["run_id"] == str(doomed.id)]
    assert [e["exit_code"] for e in exited] == [-9]
    assert exited[0]["seconds"] >= 2
    # The lane moved on: the next run was promoted, claimed and run.
    wait_until(lambda: status(following) == RunStatus.SUCCEEDED, 120, "the next run on the stack")


# ---------------------------------------------------------------- a worker whose run no longer needs it


def test_a_run_cancelled_while_its_worker_starts_has_the_worker_stopped(site: Site, coordinators: Coordinators) -> None:
    run = site.deploy({"steps": [{"name": "never", "run": "echo should not run"}]})
    coordinator = coordinators.start(site.group_token, start_delay=120)
    wait_until(lambda: bool(coordinator.events("worker.launched")), 60, "the launch")
    runner_id = Run.objects.get(id=run.id).assigned_runner_id
    assert runner_id is not None

    cancelled_at = time.time()
    user_api(site).cancel_run(str(run.id))
    assert status(run) == RunStatus.CANCELLED

    wait_until(lambda: bool(coordinator.events("worker.exited")), 60, "the worker to be stopped")
    stopping = coordinator.events("worker.stopping")
    exited = coordinator.events("worker.exited")
    print(f"\n[reconcile] cancel -> worker told to stop: {_ts(stopping[0]) - cancelled_at:.2f} s, "
          f"-> worker exited: {_ts(exited[0]) - cancelled_at:.2f} s (--reconcile-interval {INTERVAL:g})")  # fmt: skip
    assert [(e["run_id"], e["reason"], e["run_status"]) for e in stopping] == [
        (str(run.id), "run_terminal", "cancelled")
    ]
    assert exited[0]["run_id"] == str(run.id)
    # Reported as exited: its runner row is deregistered; the run stays cancelled.
    wait_until(lambda: not Runner.objects.filter(id=runner_id).exists(), 30, "the stub runner to go")
    assert status(run) == RunStatus.CANCELLED


def _ts(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["ts"]).timestamp()


# ---------------------------------------------------------------- two groups


def test_two_coordinators_of_different_groups_never_stop_each_others_workers(
    site: Site, coordinators: Coordinators
) -> None:
    other_group, other_token = services.runner_group_create(org=site.org, name="pool-b", labels={"pool": "b"})
    other_stack = services.stack_create(org=site.org, name="b-app", labels={"gantry:runner-group:pool": "b"},
                                        spec={"steps": [{"name": "x", "run": "true"}]})  # fmt: skip
    spec = {"steps": [{"name": "work", "run": "echo start; sleep 4; echo end"}]}
    mine = site.deploy(spec)
    theirs = Run.objects.get(deployment=services.deployment_create(stack=other_stack, spec=spec))
    a = coordinators.start(site.group_token, "a")
    b = coordinators.start(other_token, "b")
    wait_until(lambda: status(mine) == status(theirs) == RunStatus.RUNNING, 60, "both runs to run")
    their_runner = Run.objects.get(id=theirs.id).assigned_runner_id
    assert their_runner is not None
    assert Runner.objects.get(id=their_runner).runner_group_id == other_group.id

    # Group a's token, speaking of group b's worker: as exited, then as running.
    forged = GantryClient(site.url, site.group_token)
    for state in ("exited", "running"):
        entry = {"run_id": str(theirs.id), "runner_id": str(their_runner), "state": state, "exit_code": -9}
        assert forged.reconcile([entry]) == ([], [])
    assert status(theirs) == RunStatus.RUNNING
    assert Runner.objects.filter(id=their_runner).exists()

    wait_until(lambda: status(mine) == status(theirs) == RunStatus.SUCCEEDED, 60, "both runs to succeed")
    assert a.events("worker.stopping") == b.events("worker.stopping") == []
    assert [e["run_id"] for e in a.events("worker.launched")] == [str(mine.id)]
    assert [e["run_id"] for e in b.events("worker.launched")] == [str(theirs.id)]


# ---------------------------------------------------------------- a runner that died while no coordinator watched


def test_a_runner_that_died_while_its_coordinator_was_down_is_reported_on_restart(
    site: Site, coordinators: Coordinators
) -> None:
    run = site.deploy({"steps": [{"name": "long", "run": "echo started; sleep 600"}]})
    first = coordinators.start(site.group_token, "first")
    wait_until(lambda: status(run) == RunStatus.RUNNING, 60, "the run to start")
    [launched] = first.events("worker.launched")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    coordinators.case.kill_runner(str(launched["worker"]))
    assert status(run) == RunStatus.RUNNING  # nobody told Gantry

    second = coordinators.restart(first)

    wait_until(lambda: status(run) == RunStatus.FAILURE, 60, "the restarted coordinator's report")
    reason = Run.objects.get(id=run.id).failure_reason
    assert reason.startswith("runner lost: the worker exited with an unknown code before it reported")
    assert second.events("worker.reattached") == []
