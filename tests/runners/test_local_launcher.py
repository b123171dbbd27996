"""The local launcher with real OS processes (no server: the worker is a stand-in script).

The stand-in is started exactly as a runner would be (``<python> -m
runners.ephemeral --run-id X``) through a ``python`` shim, so the command-line
marker, the environment and the session are the real ones; it records what it
got and waits for the test to tell it to exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import launchers
from gantry_wire import procfs
from gantry_wire.procfs import start_ticks as _start_ticks
from launchers import Assignment, LaunchError
from launchers.fake import FakeLauncher
from launchers.local import LocalLauncher

STAND_IN = r"""
import json, os, subprocess, sys, time
d = os.environ["SHIM_DIR"]
run = sys.argv[sys.argv.index("--run-id") + 1]
def publish(name, text):
    # Write then rename: the test polls for the file and must never read it half-written.
    with open(f"{d}/{name}.tmp", "w") as fh:
        fh.write(text)
    os.replace(f"{d}/{name}.tmp", f"{d}/{name}")
if os.path.exists(f"{d}/{run}.orphan"):
    child = subprocess.Popen(["sleep", "300"], process_group=0)  # a "step" in the runner's session
    publish(f"{run}.child", str(child.pid))
seen = {"argv": sys.argv, "env": dict(os.environ), "sid": os.getsid(0), "pid": os.getpid()}
publish(f"{run}.seen.json", json.dumps(seen))
while not os.path.exists(f"{d}/{run}.stop"):
    time.sleep(0.02)
code = int(open(f"{d}/{run}.stop").read() or 0)
with open(os.environ["GANTRY_EXIT_FILE"], "w") as fh:
    fh.write(str(code))
sys.exit(code)
"""


def wait_for(cond: Callable[[], bool], timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def shim(tmp_path: Path) -> Path:
    folder = tmp_path / "shim"
    folder.mkdir()
    script = folder / "python"
    # exec: the shim's pid is the stand-in's pid, its command line the stand-in's.
    code = STAND_IN.replace("'", "'\"'\"'")
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{code}' \"$@\"\n")
    script.chmod(0o755)
    return folder


@pytest.fixture
def make_launcher(tmp_path: Path, shim: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], LocalLauncher]:
    monkeypatch.setenv("SHIM_DIR", str(shim))
    monkeypatch.setenv("GANTRY_GROUP_TOKEN", "group-secret")  # must never reach a worker

    def make() -> LocalLauncher:
        return LocalLauncher(tmp_path / "state", python=str(shim / "python"), pass_env=["SHIM_DIR"])

    return make


@pytest.fixture
def cleanup() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in pids:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def assignment(n: int = 1) -> Assignment:
    return Assignment(
        server="http://127.0.0.1:9", run_id=f"0000000{n}-run", runner_id=f"runner-{n}", runner_token=f"jwt-secret-{n}"
    )


def seen(shim: Path, run_id: str) -> dict[str, object]:
    path = shim / f"{run_id}.seen.json"
    wait_for(path.exists, what="the worker to start")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def stop(shim: Path, run_id: str, code: int = 0) -> None:
    (shim / f"{run_id}.stop").write_text(str(code))


def test_it_starts_a_detached_worker_with_the_token_in_its_env_only(
    make_launcher: Callable[[], LocalLauncher], shim: Path, cleanup: list[int]
) -> None:
    launcher = make_launcher()
    handle = launcher.launch(assignment())
    pid = int(handle.ident)
    cleanup.append(pid)

    got = seen(shim, handle.run_id)
    assert got["pid"] == pid
    assert got["sid"] == pid  # a session of its own: the coordinator's death does not reach it
    env = got["env"]
    assert isinstance(env, dict)
    assert env["GANTRY_RUNNER_TOKEN"] == "jwt-secret-1"
    assert (env["GANTRY_RUN_ID"], env["GANTRY_RUNNER_ID"], env["GANTRY_SERVER"]) == (
        "00000001-run", "runner-1", "http://127.0.0.1:9",
    )  # fmt: skip
    assert "GANTRY_GROUP_TOKEN" not in env
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"jwt-secret" not in cmdline
    assert b"runners.ephemeral" in cmdline
    record = json.loads((launcher.state_dir / "workers" / f"{handle.run_id}.json").read_text())
    assert record["pid"] == pid
    assert record["start_ticks"] == _start_ticks(pid)
    assert "jwt-secret" not in json.dumps(record)
    assert launcher.is_alive(handle)

    stop(shim, handle.run_id, 0)
    wait_for(lambda: not launcher.is_alive(handle), what="the worker to exit")
    assert launcher.reap(handle) == 0
    assert not (launcher.state_dir / "workers" / f"{handle.run_id}.json").exists()


def test_a_new_launcher_on_the_same_state_folder_rediscovers_running_workers(
    make_launcher: Callable[[], LocalLauncher], shim: Path, cleanup: list[int]
) -> None:
    first = make_launcher()
    running = first.launch(assignment(1))
    finished = first.launch(assignment(2))
    cleanup += [int(running.ident), int(finished.ident)]
    seen(shim, running.run_id)
    seen(shim, finished.run_id)
    stop(shim, finished.run_id, 3)
    wait_for(lambda: not first.is_alive(finished), what="worker 2 to exit")
    # The first coordinator process is gone, and its knowledge of its children
    # with it (this test keeps the Popen objects only to wait for them at the end).
    orphans = list(first._children.values())
    first._children.clear()

    second = make_launcher()
    found = second.discover()
    assert [(h.run_id, h.ident) for h in found] == [(running.run_id, running.ident)]
    assert second.is_alive(found[0])
    # The finished one was reaped by discover: its record and exit file are gone.
    assert not (second.workers_dir / f"{finished.run_id}.json").exists()
    assert not (second.workers_dir / f"{finished.run_id}.exit").exists()
    # ...and handed over once, with its exit code, for the coordinator to report.
    [unseen] = second.take_unseen_exits()
    assert (unseen.handle.run_id, unseen.handle.runner_id, unseen.exit_code) == (finished.run_id, "runner-2", 3)
    assert second.take_unseen_exits() == []

    stop(shim, running.run_id, 5)
    wait_for(lambda: not second.is_alive(found[0]), what="worker 1 to exit")
    # Not this launcher's child: the code comes from the exit file the runner wrote.
    assert second.reap(found[0]) == 5
    assert second.discover() == []
    assert [p.wait(5) for p in orphans] == [5, 3]


def test_a_reused_pid_is_not_taken_for_a_worker(
    make_launcher: Callable[[], LocalLauncher], shim: Path, cleanup: list[int]
) -> None:
    launcher = make_launcher()
    stranger = subprocess.Popen(["sleep", "30"])
    cleanup.append(stranger.pid)
    try:
        records = {
            # The pid of an unrelated live process, its own start time: the command line gives it away.
            "run-a": {"pid": stranger.pid, "start_ticks": _start_ticks(stranger.pid)},
            # The right kind of command line would not help either if the start time differs.
            "run-b": {"pid": os.getpid(), "start_ticks": 1},
        }
        for run_id, fields in records.items():
            record = {"run_id": run_id, "runner_id": "r", "started_at": time.time(), **fields}
            (launcher.workers_dir / f"{run_id}.json").write_text(json.dumps(record))

        assert launcher.discover() == []
        assert list(launcher.workers_dir.glob("*.json")) == []
        assert stranger.poll() is None, "an unrelated process must never be signalled"
    finally:
        stranger.kill()
        stranger.wait()


def test_reaping_a_killed_worker_kills_the_steps_it_left_in_its_session(
    make_launcher: Callable[[], LocalLauncher], shim: Path, cleanup: list[int]
) -> None:
    launcher = make_launcher()
    a = assignment(7)
    (shim / f"{a.run_id}.orphan").touch()
    handle = launcher.launch(a)
    cleanup.append(int(handle.ident))
    child_file = shim / f"{a.run_id}.child"
    wait_for(child_file.exists, what="the worker's step")
    child = int(child_file.read_text())
    cleanup.append(child)

    os.kill(int(handle.ident), signal.SIGKILL)  # the runner dies; its step would run on
    wait_for(lambda: not launcher.is_alive(handle), what="the worker to die")
    assert launcher.reap(handle) == -signal.SIGKILL
    wait_for(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), what="the orphaned step to be killed")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_terminate_stops_a_worker(make_launcher: Callable[[], LocalLauncher], shim: Path, cleanup: list[int]) -> None:
    launcher = make_launcher()
    handle = launcher.launch(assignment(3))
    cleanup.append(int(handle.ident))
    seen(shim, handle.run_id)
    launcher.terminate(handle, grace=5)  # the stand-in dies of SIGTERM at once
    assert not launcher.is_alive(handle)
    assert launcher.reap(handle) == -signal.SIGTERM


def test_last_lines_are_the_tail_of_the_runners_own_log(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "state")
    handle = launchers.WorkerHandle(kind="local", run_id="r1", runner_id="x", ident="1", started_at=0.0)
    assert launcher.last_lines(handle) == []  # nothing written yet
    launcher.log_file("r1").write_text("".join(f"line {i}\n" for i in range(100)))
    assert launcher.last_lines(handle, limit=3) == ["line 97", "line 98", "line 99"]


def test_a_missing_interpreter_is_a_permanent_launch_error(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "state", python=str(tmp_path / "no-such-python"))
    with pytest.raises(LaunchError) as info:
        launcher.launch(assignment())
    assert info.value.permanent
    assert "no-such-python" in info.value.message
    assert list(launcher.workers_dir.glob("*.json")) == []


def test_the_registry_finds_launchers_by_kind(tmp_path: Path) -> None:
    assert launchers.get("local") is LocalLauncher
    assert launchers.get("fake") is FakeLauncher
    assert {"local", "fake"} <= set(launchers.kinds())
    with pytest.raises(ValueError, match="unknown launcher kind 'nope'"):
        launchers.get("nope")

    made = launchers.create("local", state_dir=tmp_path / "s", options={"python": "/x/python", "pass_env": "A,B"})
    assert isinstance(made, LocalLauncher)
    assert (made.python, made.pass_env) == ("/x/python", ("A", "B"))
    with pytest.raises(ValueError, match="unknown local launcher options: colour"):
        launchers.create("local", state_dir=tmp_path / "s", options={"colour": "red"})


def test_the_fake_launcher_records_fails_and_finishes_on_command() -> None:
    fake = FakeLauncher()
    fake.fail_next("no capacity", permanent=False)
    with pytest.raises(LaunchError) as info:
        fake.launch(assignment(1))
    assert not info.value.permanent
    handle = fake.launch(assignment(1))
    assert fake.launched == [assignment(1)]
    assert fake.discover() == [handle]
    # A "restarted" coordinator: another launcher on the same world.
    again = FakeLauncher(world=fake.world)
    assert again.discover() == [handle]
    fake.finish(handle.run_id, code=4)
    assert not again.is_alive(handle)
    assert again.reap(handle) == 4
    assert again.discover() == []


def test_a_workers_exit_is_told_at_once_and_its_zombie_kept_until_reap(
    make_launcher: Callable[[], LocalLauncher], shim: Path, cleanup: list[int]
) -> None:
    launcher = make_launcher()
    told = threading.Event()
    launcher.exit_listener = told.set
    handle = launcher.launch(assignment())
    pid = int(handle.ident)
    cleanup.append(pid)
    seen(shim, handle.run_id)
    assert not told.is_set()

    stop(shim, handle.run_id, 3)

    assert told.wait(20), "the launcher never told of the exit"
    # Told, not reaped: the zombie keeps its pid (and its session's id) until reap() sweeps the session.
    fields = procfs.stat_fields(pid)
    assert fields is not None
    assert fields[procfs.STATE] == b"Z"
    assert launcher.reap(handle) == 3
    assert procfs.stat_fields(pid) is None
