"""Warm runners (``--warm N``), end to end: a real ``python -m runners.coordinator`` with the local launcher
against ``live_server``, its warm runners real processes: forked by the launcher's zygote (``python -m
runners.ephemeral --zygote``, the default) or, with ``--launcher-option warm_fork=false``, each a fresh
``python -m runners.ephemeral --warm`` interpreter. The tests that concern how a warm runner is held run
with both.

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


def start(site: Site, started: list[Coordinator], *, warm_n: int, max_parallel: int = 2, fork: bool = True,
          state_dir: Path | None = None) -> Coordinator:  # fmt: skip
    folder = site.tmp / f"coordinator-{len(started)}"
    folder.mkdir()
    state = state_dir or folder / "state"
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
            "--state-dir", str(state), "--max-parallel", str(max_parallel), "--wait", "5",
            "--reconcile-interval", "1", "--health-addr", "127.0.0.1:0"]  # fmt: skip
    if not fork:
        argv += ["--launcher-option", "warm_fork=false"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    coordinator = Coordinator(proc, log, state)
    started.append(coordinator)
    wait_until(lambda: len(coordinator.started_warm()) >= warm_n or proc.poll() is not None, 30, "warm runners")
    assert proc.poll() is None, log.read_text()
    return coordinator


def status(run: Run) -> str:
    return str(Run.objects.values_list("status", flat=True).get(id=run.id))


HOW = pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh"])


@HOW
def test_a_warm_runner_holds_nothing_then_takes_a_claim_and_the_run_succeeds(
    site: Site, coordinators: list[Coordinator], fork: bool
) -> None:
    coordinator = start(site, coordinators, warm_n=1, fork=fork)
    [pid] = coordinator.started_warm()
    waiting = environ(pid)
    assert not {"GANTRY_RUNNER_TOKEN", "GANTRY_GROUP_TOKEN", "GANTRY_RUN_ID", "GANTRY_RUNNER_ID"} & waiting.keys()
    # A session of its own either way, as a cold runner's: its steps' processes are its session.
    assert os.getsid(pid) == pid
    if fork:
        [zygote] = coordinator.events("warm.zygote_started")
        assert int(procfs.stat_fields(pid)[procfs.PPID]) == zygote["pid"]
        assert procfs.cmdline(pid) == procfs.cmdline(zygote["pid"])  # a fork: the zygote's command line
        assert b"--zygote" in procfs.cmdline(pid)
        assert zygote["zygote"].encode() in procfs.cmdline(pid)
    else:
        assert b"--warm" in procfs.cmdline(pid)
        assert coordinator.events("warm.zygote_started") == []
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


@HOW
def test_a_warm_runner_killed_while_waiting_is_replaced_and_no_run_is_touched(
    site: Site, coordinators: list[Coordinator], fork: bool
) -> None:
    coordinator = start(site, coordinators, warm_n=1, fork=fork)
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


@HOW
def test_shutdown_stops_the_warm_runners_and_leaves_busy_workers_running(
    site: Site, coordinators: list[Coordinator], fork: bool
) -> None:
    coordinator = start(site, coordinators, warm_n=2, max_parallel=3, fork=fork)
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
    # The zygote (if any) went with the coordinator; the busy worker it forked did not.
    assert not any(alive(e["pid"]) for e in coordinator.events("warm.zygote_started"))
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


# ---------------------------------------------------------------- the zygote (forked warm runners)


def test_what_a_forked_runners_step_left_in_its_session_is_killed_when_the_runner_ends(
    site: Site, coordinators: list[Coordinator]
) -> None:
    coordinator = start(site, coordinators, warm_n=1)
    # Job control puts the background job in a process group of its own: the runner's stop of the step's
    # group misses it, and only the sweep of the runner's session (by its zygote, the parent) reaches it.
    pid_file = site.tmp / "leftover.pid"
    run = site.deploy({"steps": [{"name": "leave", "run": f"set -m; sleep 300 & echo $! > {pid_file}; echo left"}]})
    wait_until(lambda: status(run) == RunStatus.SUCCEEDED, 60, "the run to succeed")
    [launched] = coordinator.events("worker.launched")
    assert launched["warm"] is True
    leftover = int(pid_file.read_text())
    wait_until(lambda: not alive(leftover), 30, "the leftover step process to be killed")
    [exited] = coordinator.events("worker.exited")
    assert (exited["run_id"], exited["exit_code"]) == (str(run.id), 0)


def test_a_killed_zygote_is_replaced_and_the_runners_it_forked_go_on(
    site: Site, coordinators: list[Coordinator]
) -> None:
    coordinator = start(site, coordinators, warm_n=2)
    [first] = coordinator.events("warm.zygote_started")
    idle = coordinator.started_warm()

    os.kill(first["pid"], signal.SIGKILL)

    wait_until(lambda: bool(coordinator.events("warm.zygote_exited")), 30, "the zygote's end noticed")
    # Its children are sessions of their own: still waiting, still the pool's.
    assert all(alive(pid) for pid in idle)
    run = site.deploy({"steps": [{"name": "x", "run": "echo after the zygote"}]})
    wait_until(lambda: status(run) == RunStatus.SUCCEEDED, 60, "the run to succeed")
    [launched] = coordinator.events("worker.launched")
    assert (launched["warm"], int(launched["worker"]) in idle) == (True, True)
    # The used one's replacement came from a new zygote.
    wait_until(lambda: len(coordinator.started_warm()) == 3, 30, "a replacement warm runner")
    [_, second] = coordinator.events("warm.zygote_started")
    assert second["zygote"] != first["zygote"]
    assert int(procfs.stat_fields(coordinator.started_warm()[2])[procfs.PPID]) == second["pid"]
    wait_until(lambda: bool(coordinator.events("worker.exited")), 30, "the worker's exit")
    [exited] = coordinator.events("worker.exited")
    # No zygote saw it end (its parent died): the code comes from the runner's exit file.
    assert (exited["run_id"], exited["exit_code"]) == (str(run.id), 0)


def test_a_coordinator_killed_while_a_forked_runner_is_busy_is_succeeded_by_one_that_reattaches(
    site: Site, coordinators: list[Coordinator]
) -> None:
    first = start(site, coordinators, warm_n=2, max_parallel=2)
    [zygote] = first.events("warm.zygote_started")
    run = site.deploy({"steps": [{"name": "busy", "run": "sleep 3; echo still here"}]})
    wait_until(lambda: status(run) == RunStatus.RUNNING, 60, "the run to start")
    [launched] = first.events("worker.launched")
    busy = int(launched["worker"])
    idle = [pid for pid in first.started_warm() if pid != busy and alive(pid)]

    first.proc.kill()
    first.proc.wait(30)

    # The zygote reads end-of-file and goes; so do the idle warm runners (their claim pipes were the
    # coordinator's); the busy one runs on.
    wait_until(lambda: not alive(zygote["pid"]), 30, "the zygote to exit")
    wait_until(lambda: not any(alive(pid) for pid in idle), 30, "the idle warm runners to exit")
    assert alive(busy)
    second = start(site, coordinators, warm_n=1, max_parallel=2, state_dir=first.state_dir)
    wait_until(lambda: bool(second.events("worker.reattached")), 30, "the re-attach")
    [reattached] = second.events("worker.reattached")
    assert (reattached["run_id"], reattached["worker"]) == (str(run.id), str(busy))
    wait_until(lambda: status(run) == RunStatus.SUCCEEDED, 60, "the run to succeed")
    wait_until(lambda: bool(second.events("worker.exited")), 30, "the worker's exit")
    [exited] = second.events("worker.exited")
    assert (exited["run_id"], exited["exit_code"]) == (str(run.id), 0)


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
