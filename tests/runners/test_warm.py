"""Warm runners (``--warm N``), end to end: a real ``python -m runners.coordinator`` with the local launcher
against ``live_server``, its warm runners real ``python -m runners.ephemeral --warm`` processes.

What is observed: the coordinator's JSON log (``warm.started`` names each warm
runner's pid, ``worker.launched`` says whether a claim went to a warm one),
the processes themselves (``/proc``) and the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gantry.core import services
from gantry.core.models import Run, RunEvent, Runner, RunStatus
from gantry_wire import procfs
from runners import warm
from runners.client import GantryClient
from tests.runners.conftest import ROOT, Site, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Coordinator:
    proc: subprocess.Popen[bytes]
    log: Path
    state_dir: Path
    warm_pids: list[int] = field(default_factory=list)

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines() if self.log.exists() else []:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == name:
                    found.append(record)
        return found

    def started_warm(self) -> list[int]:
        return [int(e["pid"]) for e in self.events("warm.started")]

    def metric(self, name: str) -> float:
        [started] = self.events("coordinator.started")
        with urllib.request.urlopen(f"http://{started['health_addr']}/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")


def alive(pid: int) -> bool:
    fields = procfs.stat_fields(pid)
    return fields is not None and fields[procfs.STATE] != b"Z"


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@pytest.fixture
def coordinators(site: Site) -> Iterator[list[Coordinator]]:
    started: list[Coordinator] = []
    yield started
    for c in started:
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(60)
        if c.proc.poll() is None:
            c.proc.kill()
        # Whatever a failed test left: the warm runners and the workers' sessions.
        pids = [*c.started_warm()]
        for record in (c.state_dir / "workers").glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                pids.extend(procfs.members(procfs.SESSION, int(json.loads(record.read_text())["pid"])))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def start(site: Site, started: list[Coordinator], *, warm_n: int, max_parallel: int = 2) -> Coordinator:
    folder = site.tmp / f"coordinator-{len(started)}"
    folder.mkdir()
    log = folder / "coordinator.log"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(ROOT),
        "GANTRY_GROUP_TOKEN": site.group_token,
        "GANTRY_STOP_GRACE": "2",
        "GANTRY_WARM": str(warm_n),  # the variable, as a deployment sets it
    }
    argv = [sys.executable, "-m", "runners.coordinator", "--server", site.url, "--launcher", "local",
            "--state-dir", str(folder / "state"), "--max-parallel", str(max_parallel), "--wait", "5",
            "--reconcile-interval", "1", "--health-addr", "127.0.0.1:0"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    coordinator = Coordinator(proc, log, folder / "state")
    started.append(coordinator)
    wait_until(lambda: len(coordinator.started_warm()) >= warm_n or proc.poll() is not None, 30, "warm runners")
    assert proc.poll() is None, log.read_text()
    return coordinator


def status(run: Run) -> str:
    return str(Run.objects.values_list("status", flat=True).get(id=run.id))


def test_a_warm_runner_holds_nothing_then_takes_a_claim_and_the_run_succeeds(
    site: Site, coordinators: list[Coordinator]
) -> None:
    coordinator = start(site, coordinators, warm_n=1)
    [pid] = coordinator.started_warm()
    waiting = environ(pid)
    assert not {"GANTRY_RUNNER_TOKEN", "GANTRY_GROUP_TOKEN", "GANTRY_RUN_ID", "GANTRY_RUNNER_ID"} & waiting.keys()
    assert b"--warm" in procfs.cmdline(pid)
    # An idle warm runner is not a worker: nothing of it is recorded, nothing to re-attach.
    assert list((coordinator.state_dir / "workers").glob("*.json")) == []

    run = site.deploy({"steps": [{"name": "hi", "run": "echo hello from a warm runner"}]})
    wait_until(lambda: status(run) == RunStatus.SUCCEEDED, 60, "the run to succeed")

    [launched] = coordinator.events("worker.launched")
    assert (launched["run_id"], launched["warm"], launched["worker"]) == (str(run.id), True, str(pid))
    # The protocol is unchanged: the warm runner called ready and accept for its run (else it could not
    # run its step), shipped its log and reported done, as a cold one does.
    logs = GantryClient(site.url, site.user_token, scheme="Token", timeout=30).run_logs(str(run.id))
    assert "hello from a warm runner" in logs["text"]
    wait_until(lambda: not alive(pid), 30, "the runner to exit after its run")
    # Its place was taken by a new warm runner.
    wait_until(lambda: len(coordinator.started_warm()) == 2, 30, "a replacement warm runner")
    assert coordinator.started_warm()[1] != pid


def test_a_warm_runner_killed_while_waiting_is_replaced_and_no_run_is_touched(
    site: Site, coordinators: list[Coordinator]
) -> None:
    coordinator = start(site, coordinators, warm_n=1)
    # A run in flight on a busy worker (the first warm runner): the kill below must not reach it.
    busy_run = site.deploy({"steps": [{"name": "busy", "run": "echo busy; sleep 3"}]})
    wait_until(lambda: status(busy_run) == RunStatus.RUNNING, 60, "the busy run to start")
    wait_until(lambda: len(coordinator.started_warm()) == 2, 30, "the used warm runner's replacement")
    waiting = coordinator.started_warm()[1]

    os.kill(waiting, signal.SIGKILL)

    wait_until(lambda: len(coordinator.started_warm()) == 3, 30, "a replacement for the killed warm runner")
    [exited] = coordinator.events("warm.exited")
    assert (exited["worker"], exited["exit_code"]) == (coordinator.events("warm.started")[1]["worker"], -9)
    assert status(busy_run) == RunStatus.RUNNING
    assert Runner.objects.filter(runner_group=site.group).count() == 1  # the busy run's, and no other
    assert coordinator.events("worker.exited") == coordinator.events("dispatch.failed") == []
    wait_until(lambda: status(busy_run) == RunStatus.SUCCEEDED, 60, "the busy run to succeed")
    assert not RunEvent.objects.filter(run_id=busy_run.id, kind="runner_exited").exists()
    # The replacement serves the next run.
    replacement = coordinator.started_warm()[2]
    run = site.deploy({"steps": [{"name": "x", "run": "true"}]})
    wait_until(lambda: status(run) == RunStatus.SUCCEEDED, 60, "the next run to succeed")
    launched = {e["run_id"]: e for e in coordinator.events("worker.launched")}
    assert (launched[str(run.id)]["warm"], launched[str(run.id)]["worker"]) == (True, str(replacement))


def test_shutdown_stops_the_warm_runners_and_leaves_busy_workers_running(
    site: Site, coordinators: list[Coordinator]
) -> None:
    coordinator = start(site, coordinators, warm_n=2, max_parallel=3)
    run = site.deploy({"steps": [{"name": "busy", "run": "sleep 3; echo done"}]})
    wait_until(lambda: status(run) == RunStatus.RUNNING, 60, "the run to start")
    wait_until(lambda: len(coordinator.started_warm()) == 3, 30, "the used warm runner's replacement")
    [launched] = coordinator.events("worker.launched")
    busy = int(launched["worker"])
    idle = [pid for pid in coordinator.started_warm() if pid != busy]

    coordinator.proc.send_signal(signal.SIGTERM)
    assert coordinator.proc.wait(60) == 0

    assert [e["count"] for e in coordinator.events("warm.stopped")] == [2]
    assert not any(alive(pid) for pid in idle)
    assert alive(busy) or status(run) == RunStatus.SUCCEEDED  # the busy worker was left to finish its run
    wait_until(lambda: status(run) == RunStatus.SUCCEEDED, 60, "the busy worker's run to succeed")


def test_the_warm_count_stays_n_while_runs_flow(site: Site, coordinators: list[Coordinator]) -> None:
    coordinator = start(site, coordinators, warm_n=2)
    other = services.stack_create(org=site.org, name="other", labels={"gantry:runner-group:os": "linux"},
                                  spec={"steps": [{"name": "x", "run": "true"}]})  # fmt: skip
    runs = []
    for i in range(3):  # two lanes (one run at a time on a stack), three runs each
        runs.append(site.deploy({"steps": [{"name": "a", "run": f"echo a{i}"}]}))
        runs.append(Run.objects.get(deployment=services.deployment_create(stack=other)))

    wait_until(lambda: all(status(r) == RunStatus.SUCCEEDED for r in runs), 120, "every run to succeed")

    launched = coordinator.events("worker.launched")
    assert sorted(e["run_id"] for e in launched) == sorted(str(r.id) for r in runs)
    # Each used warm runner is replaced: N idle again once the flow is over (the last workers have exited).
    wait_until(lambda: coordinator.metric("gantry_coordinator_workers_running") == 0, 30, "the workers to exit")
    wait_until(lambda: coordinator.metric("gantry_coordinator_workers_warm") == 2, 30, "two warm runners again")
    assert len(coordinator.started_warm()) == 2 + sum(e["warm"] for e in launched)
    assert sum(alive(pid) for pid in coordinator.started_warm()) == 2


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--max-parallel", "2", "--warm", "3"], "--warm (GANTRY_WARM) must be from 0 to 2, not 3"),
        (["--warm", "-1"], "--warm (GANTRY_WARM) must be from 0 to 4, not -1"),
        (
            ["--launcher", "kubernetes", "--warm", "1"],
            "--warm (GANTRY_WARM): the kubernetes launcher keeps no warm runners (local and docker do)",
        ),
    ],
)
def test_warm_is_bounded_and_needs_a_launcher_with_warm_runners(tmp_path: Path, args: list[str], says: str) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "GANTRY_GROUP_TOKEN": "x.y.z"}
    argv = [sys.executable, "-m", "runners.coordinator", "--server", "http://127.0.0.1:9",
            "--state-dir", str(tmp_path), *args]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (2, f"python -m runners.coordinator: error: {says}")


@pytest.mark.parametrize(
    ("claim", "code", "says"),
    [
        (b"", 0, None),  # end-of-file: not needed, holds nothing
        (b"not json\n", 4, "the claim is not JSON"),
        (b'{"env": {"LD_PRELOAD": "/tmp/x.so"}}\n', 4, "variables a claim does not carry: LD_PRELOAD"),
        (b'{"env": {"GANTRY_RUN_ID": 5}}\n', 4, 'the claim is not {"env"'),
    ],
)
def test_a_warm_runner_refuses_a_malformed_claim_and_exits_at_end_of_file(
    tmp_path: Path, claim: bytes, code: int, says: str | None
) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "runners.ephemeral", "--warm", "warm-test"]
    done = subprocess.run(argv, cwd=ROOT, env=env, input=claim, capture_output=True, timeout=60)
    assert done.returncode == code
    if says is None:
        assert done.stdout == done.stderr == b""
    else:
        [line] = done.stderr.decode().splitlines()
        assert json.loads(line)["event"] == "runner.warm_bad_claim"
        assert says in json.loads(line)["msg"]


def test_split_warm_takes_both_spellings() -> None:
    assert warm.split_warm(["--warm", "w1", "--launcher", "local"]) == (["--launcher", "local"], "w1")
    assert warm.split_warm(["--warm=w2"]) == ([], "w2")
    assert warm.split_warm(["--run-id", "r"]) == (["--run-id", "r"], None)
