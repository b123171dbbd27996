"""Runs end to end: server, coordinator and ephemeral runners as real processes (see conftest.py).

Each test drives a run through the public API and judges what a user and an
operator would see: the run's status, exit code and events, its log read back
through the API, the coordinator's log lines, and the processes left behind.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.e2e.conftest import Coordinator, Lab, wait_until


def kinds(run: dict[str, object]) -> list[str]:
    events = run["events"]
    assert isinstance(events, list)
    return [str(e["kind"]) for e in events]


def group_gone(pgid: int, timeout: float = 30) -> None:
    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, timeout, f"process group {pgid} to be gone")


def test_a_run_succeeds(lab: Lab) -> None:
    coordinator = lab.coordinator()
    run_id = lab.deploy(
        [
            {"name": "hello", "run": 'echo "hello $WHO"'},
            {"name": "count", "run": "for i in 1 2 3; do echo tick $i; sleep 0.2; done"},
        ],
        env={"WHO": "e2e"},
    )

    run = lab.wait_terminal(run_id)
    assert run["status"] == "succeeded", run
    assert run["exit_code"] == 0
    assert kinds(run).count("finished") == 1
    text, _ = lab.read_log(run_id)
    assert text.startswith("==> [1/2] hello\nhello e2e\n==> [1/2] hello: exit code 0")
    assert "tick 1\ntick 2\ntick 3\n==> [2/2] count: exit code 0" in text
    # Line times (docs/logs.md): the runner's marks come back with the log, and the ticks are 0.2 s apart.
    marks = lab.api.request("GET", f"/api/v1/runs/{run_id}/logs", query={"offset": 0, "times": 1}).json()["times"]
    assert marks
    assert marks[0][0] == 0

    def written(line: str) -> int:
        at = len(text[: text.index(line)].encode())
        return [ms for offset, ms in marks if offset <= at][-1]

    started = datetime.fromisoformat(str(run["started_at"])).timestamp() * 1000
    finished = datetime.fromisoformat(str(run["finished_at"])).timestamp() * 1000
    assert started - 1000 <= written("hello e2e") <= written("tick 1\n") < written("tick 3\n") <= finished + 1000
    assert written("tick 3\n") - written("tick 1\n") >= 300
    exited = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the worker to be reaped")
    assert exited[0]["exit_code"] == 0
    assert coordinator.named("run.claimed", run_id)
    assert coordinator.named("worker.launched", run_id)


def test_a_failing_step_fails_the_run(lab: Lab) -> None:
    coordinator = lab.coordinator()
    run_id = lab.deploy([{"name": "ok", "run": "echo fine"}, {"name": "bad", "run": "echo oops >&2; exit 7"}])

    run = lab.wait_terminal(run_id)
    assert run["status"] == "failure"
    assert run["exit_code"] == 7
    assert "step 2 (bad) exited with code 7" in run["failure_reason"]
    text, _ = lab.read_log(run_id)
    assert "oops\n==> [2/2] bad: exit code 7" in text
    exited = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the worker to be reaped")
    assert exited[0]["exit_code"] == 1  # the runner's own code: the run failed


def test_a_run_cancelled_mid_step_stops_its_process_group(lab: Lab) -> None:
    lab.coordinator()
    pidfile = lab.tmp / "step.pid"
    run_id = lab.deploy(
        [{"name": "forever", "run": f"echo $$ > {pidfile}; echo working; sleep 600 & sleep 600 & wait"}]
    )
    wait_until(pidfile.exists, 60, "the step to start")
    wait_until(lambda: "working" in lab.log_so_far(run_id), 30, "the live log to show the step's output")

    lab.api.cancel_run(run_id)
    run = lab.wait_terminal(run_id)
    assert run["status"] == "cancelled"
    group_gone(int(pidfile.read_text()))
    assert kinds(run)[-3:] == ["cancel_requested", "cancel_acknowledged", "finished"]
    text, _ = lab.read_log(run_id)
    assert "working\n[gantry: cancelled; stopping the step" in text


def test_a_run_past_its_timeout_fails(lab: Lab) -> None:
    lab.coordinator()
    pidfile = lab.tmp / "step.pid"
    run_id = lab.deploy([{"name": "slow", "run": f"echo $$ > {pidfile}; sleep 600"}], timeout_seconds=2)

    run = lab.wait_terminal(run_id)
    assert run["status"] == "failure"
    assert run["exit_code"] == 124
    assert "timed out after 2s" in run["failure_reason"]
    group_gone(int(pidfile.read_text()))


def test_a_coordinator_killed_and_restarted_reattaches_and_the_run_completes_once(lab: Lab) -> None:
    first = lab.coordinator()
    go = lab.tmp / "go"
    run_id = lab.deploy(
        [{"name": "wait for go", "run": f"echo waiting; while [ ! -f {go} ]; do sleep 0.1; done; echo went"}]
    )
    lab.wait_status(run_id, {"running"})
    [launched] = wait_until(lambda: first.named("worker.launched", run_id), 30, "the launch")
    pid = int(launched["worker"])

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    second = lab.coordinator(state_dir=first.state_dir)
    [reattached] = wait_until(lambda: second.named("worker.reattached", run_id), 30, "the re-attach")
    assert reattached["msg"] == f"re-attached to pid {pid} for run {run_id}"

    go.touch()
    run = lab.wait_terminal(run_id)
    assert run["status"] == "succeeded"
    assert kinds(run).count("finished") == 1
    assert kinds(run).count("accepted") == 1
    exited = wait_until(lambda: second.named("worker.exited", run_id), 30, "the re-attached worker to be reaped")
    assert exited[0]["exit_code"] == 0  # read from the exit file: not the second coordinator's child
    assert "went" in lab.read_log(run_id)[0]


def _partial_run(lab: Lab, pidfile: Path) -> tuple[Coordinator, str, int]:
    """A coordinator and a run whose step wrote a line and sleeps: (coordinator, run id, its runner's pid)."""
    coordinator = lab.coordinator()
    run_id = lab.deploy(
        [{"name": "partial", "run": f"echo $$ > {pidfile}; echo 'partial output before the crash'; sleep 600"}]
    )
    wait_until(lambda: "partial output" in lab.log_so_far(run_id), 60, "the live log to show the partial output")
    [launched] = coordinator.named("worker.launched", run_id)
    return coordinator, run_id, int(launched["worker"])


def test_a_runner_killed_fails_its_run_at_once_and_its_partial_log_survives(lab: Lab) -> None:
    pidfile = lab.tmp / "step.pid"
    coordinator, run_id, runner_pid = _partial_run(lab, pidfile)
    os.kill(runner_pid, signal.SIGKILL)

    # The coordinator notices, sweeps the step the dead runner left behind,
    # and reports the exit: the run fails now, not an hour later.
    exited = wait_until(lambda: coordinator.named("worker.exited", run_id), 60, "the dead worker to be reaped")
    assert exited[0]["exit_code"] == -signal.SIGKILL
    group_gone(int(pidfile.read_text()))
    run = lab.wait_terminal(run_id, timeout=60)
    assert run["status"] == "failure"
    assert run["failure_reason"].startswith("runner lost: the worker was killed by signal 9")
    assert "runner_exited" in kinds(run)
    text, _ = lab.read_log(run_id)
    assert "partial output before the crash" in text


def test_a_runner_killed_while_no_coordinator_watches_is_failed_by_the_reaper(lab: Lab) -> None:
    pidfile = lab.tmp / "orphan.pid"
    coordinator, run_id, runner_pid = _partial_run(lab, pidfile)
    coordinator.proc.send_signal(signal.SIGKILL)
    coordinator.proc.wait(30)
    os.kill(runner_pid, signal.SIGKILL)
    assert lab.run(run_id)["status"] == "running"  # nobody told the server

    # An hour of silence later, as the reaper sees it: the backstop.
    later = datetime.now(UTC) + timedelta(hours=1, minutes=1)
    out = lab.server.manage("reap", "--only", "inactive_runners", "--now", later.isoformat())
    run = lab.wait_terminal(run_id, timeout=30)
    assert run["status"] == "failure", out
    assert "lost" in run["failure_reason"]
    assert "runner_lost" in kinds(run)
    text, _ = lab.read_log(run_id)
    assert "partial output before the crash" in text
    os.killpg(int(pidfile.read_text()), signal.SIGKILL)  # the orphaned step: no coordinator swept it


def test_a_launch_that_fails_is_reported_as_dispatch_failed(lab: Lab) -> None:
    coordinator = lab.coordinator("--launcher-option", "python=/nonexistent/python")
    run_id = lab.deploy([{"name": "never", "run": "echo never"}])

    run = lab.wait_terminal(run_id)
    assert run["status"] == "failure"
    assert run["failure_reason"].startswith("dispatch failed: cannot start /nonexistent/python")
    assert "dispatch_failed" in kinds(run)
    group = lab.api.request("GET", f"/api/v1/runner-groups/{lab.group_id}").json()
    assert "nonexistent" in group["last_dispatch_error"]
    [failed] = wait_until(lambda: coordinator.named("dispatch.failed", run_id), 30, "the coordinator's report")
    assert failed["permanent"] is True
    assert coordinator.proc.poll() is None  # it carries on (backing off)


def test_50_mib_of_output_comes_back_complete_and_each_chunk_is_uploaded_once(lab: Lab) -> None:
    lab.coordinator()
    lines = 6_553_600  # "%07d\n": 8 bytes a line, 50 MiB
    started = time.monotonic()
    run_id = lab.deploy([{"name": "numbers", "run": f"seq -w 0 {lines - 1}"}])
    run = lab.wait_terminal(run_id, timeout=600)
    ran = time.monotonic() - started
    assert run["status"] == "succeeded", run

    read_from = time.monotonic()
    text, pages = lab.read_log(run_id)
    read = time.monotonic() - read_from
    header, rest = text.split("\n", 1)
    assert header == "==> [1/1] numbers"
    body, _footer = rest.rsplit("==> [1/1] numbers: exit code 0", 1)
    expected = "".join(f"{i:07d}\n" for i in range(lines))
    assert len(body) == len(expected) == 50 * 1024 * 1024
    assert body == expected  # complete and in order

    versions = lab.server.s3.get_paginator("list_object_versions")
    keys: dict[str, int] = {}
    for page in versions.paginate(Bucket="gantry-e2e-logs", Prefix=f"runs/{run_id}/"):
        for version in page.get("Versions", []):
            keys[version["Key"]] = keys.get(version["Key"], 0) + 1
    chunks = sorted(k for k in keys if "/chunks/" in k)
    chunk_count = len(chunks)
    assert chunk_count == 51  # 50 MiB plus the header and footer lines
    assert chunks == [f"runs/{run_id}/chunks/{n:08d}.gz" for n in range(chunk_count)]
    # Beside each chunk, its line times (docs/logs.md, "Line times"); nothing else.
    assert sorted(set(keys) - set(chunks)) == [f"runs/{run_id}/times/{n:08d}.json" for n in range(chunk_count)]
    assert set(keys.values()) == {1}, "a chunk (or its times) was PUT more than once"
    print(
        f"\n50 MiB run: queued to succeeded in {ran:.1f}s ({run['started_at']} → {run['finished_at']}); "
        f"{chunk_count} chunks; read back in {read:.1f}s over {pages} pages"
    )


def test_sigterm_stops_the_coordinator_and_leaves_its_worker_running(lab: Lab) -> None:
    coordinator = lab.coordinator()
    go = lab.tmp / "go"
    run_id = lab.deploy([{"name": "wait", "run": f"while [ ! -f {go} ]; do sleep 0.1; done"}])
    lab.wait_status(run_id, {"running"})
    [launched] = coordinator.named("worker.launched", run_id)

    coordinator.proc.send_signal(signal.SIGTERM)
    # The timeout is a hang guard; that the stop cuts a parked poll off rather than waiting it out is
    # tests/runners/test_coordinator.py::test_stop_cuts_off_a_parked_long_poll's (SIGTERM calls that stop()).
    assert coordinator.proc.wait(60) == 0
    assert coordinator.named("coordinator.stopped")
    assert Path(f"/proc/{launched['worker']}").exists()  # the worker carries on by itself

    go.touch()
    assert lab.wait_terminal(run_id)["status"] == "succeeded"
