"""Runs end to end through the Docker launcher: a real server, coordinators, and runners in containers.

Each test drives a run through the public API and judges what a user and an
operator see: the run's status, exit code, events and log (read back through
the API), the coordinator's log lines, and the containers on the engine.
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.test_runs import kinds
from tests.launchers_docker.conftest import DockerLab

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

# A JWT's first two segments: what a runner token (or any other) looks like in text.
JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
WAIT_FOR_GO = "echo waiting; while [ ! -f /shared/go ]; do sleep 0.1; done; echo went"


def test_a_run_succeeds_in_a_container_and_its_log_reads_back(dlab: DockerLab) -> None:
    coordinator = dlab.coordinator()
    run_id = dlab.lab.deploy(
        [
            {"name": "where", "run": 'echo "uid $(id -u) init $(cat /proc/1/comm) who $WHO"; ls /opt/gantry/runners'},
            {"name": "count", "run": "for i in 1 2 3; do echo tick $i; sleep 0.2; done"},
        ],
        env={"WHO": "docker"},
    )

    run = dlab.lab.wait_terminal(run_id)
    assert run["status"] == "succeeded", run
    assert run["exit_code"] == 0
    assert kinds(run).count("finished") == 1
    [launched] = coordinator.named("worker.launched", run_id)
    container_id = launched["worker"]
    text, _ = dlab.lab.read_log(run_id)
    # The step ran in the runner image's container (Docker's init as PID 1), not as root.
    assert "uid 10001 init docker-init who docker\n" in text
    assert "ephemeral.py\n" in text
    assert "tick 1\ntick 2\ntick 3\n==> [2/2] count: exit code 0" in text
    [exited] = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the worker to be reaped")
    assert exited["exit_code"] == 0
    assert launched["msg"] == f"launched docker worker {container_id} for run {run_id}"
    wait_until(lambda: not dlab.containers(run_id=run_id), 30, "the container to be removed")


def test_a_failing_step_fails_the_run_with_its_exit_code(dlab: DockerLab) -> None:
    coordinator = dlab.coordinator()
    run_id = dlab.lab.deploy([{"name": "ok", "run": "echo fine"}, {"name": "bad", "run": "echo oops >&2; exit 7"}])

    run = dlab.lab.wait_terminal(run_id)
    assert run["status"] == "failure"
    assert run["exit_code"] == 7
    assert "step 2 (bad) exited with code 7" in run["failure_reason"]
    assert "oops\n==> [2/2] bad: exit code 7" in dlab.lab.read_log(run_id)[0]
    [exited] = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the worker to be reaped")
    assert exited["exit_code"] == 1  # the runner's own code, from the container's state: the run failed


def test_a_run_cancelled_mid_step_stops_its_container(dlab: DockerLab) -> None:
    dlab.coordinator()
    run_id = dlab.lab.deploy([{"name": "forever", "run": "echo working; sleep 600 & sleep 600 & wait"}])
    wait_until(lambda: "working" in dlab.lab.log_so_far(run_id), 60, "the live log to show the step's output")
    [container] = dlab.containers(run_id=run_id)
    assert container.status == "running"

    dlab.lab.api.cancel_run(run_id)
    run = dlab.lab.wait_terminal(run_id)
    assert run["status"] == "cancelled"
    assert kinds(run)[-3:] == ["cancel_requested", "cancel_acknowledged", "finished"]
    assert "working\n[gantry: cancelled; stopping the step" in dlab.lab.read_log(run_id)[0]
    # The runner stopped its step and exited; the coordinator reaped and removed the container.
    wait_until(lambda: not dlab.containers(run_id=run_id), 30, "the container to be stopped and removed")


def test_a_coordinator_killed_and_restarted_reattaches_and_the_run_completes_once(dlab: DockerLab) -> None:
    first = dlab.coordinator()
    run_id = dlab.lab.deploy([{"name": "wait for go", "run": WAIT_FOR_GO}])
    dlab.lab.wait_status(run_id, {"running"})
    [launched] = wait_until(lambda: first.named("worker.launched", run_id), 30, "the launch")

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    [container] = dlab.containers(run_id=run_id)
    assert container.status == "running"  # the run carries on without its coordinator
    second = dlab.coordinator(state_dir=first.state_dir)
    [reattached] = wait_until(lambda: second.named("worker.reattached", run_id), 30, "the re-attach")
    assert reattached["msg"] == f"re-attached to docker worker {launched['worker']} for run {run_id}"

    (dlab.shared / "go").touch()
    run = dlab.lab.wait_terminal(run_id)
    assert run["status"] == "succeeded"
    assert kinds(run).count("accepted") == 1
    assert kinds(run).count("finished") == 1
    [exited] = wait_until(lambda: second.named("worker.exited", run_id), 30, "the re-attached worker to be reaped")
    assert exited["exit_code"] == 0  # read from the container's state by a coordinator that did not start it
    assert "went" in dlab.lab.read_log(run_id)[0]
    assert second.named("run.claimed") == []  # nothing was claimed twice
    wait_until(lambda: not dlab.containers(run_id=run_id), 30, "the container to be removed")


def test_a_missing_image_is_reported_as_dispatch_failed_with_dockers_words(dlab: DockerLab) -> None:
    coordinator = dlab.coordinator("image=gantry-no-such-image:never")
    run_id = dlab.lab.deploy([{"name": "never", "run": "echo never"}])

    run = dlab.lab.wait_terminal(run_id)
    assert run["status"] == "failure"
    assert run["failure_reason"].startswith("dispatch failed: docker: image gantry-no-such-image:never")
    assert "dispatch_failed" in kinds(run)
    group = dlab.lab.api.request("GET", f"/api/v1/runner-groups/{dlab.lab.group_id}").json()
    assert "No such image: gantry-no-such-image:never" in group["last_dispatch_error"]
    [failed] = wait_until(lambda: coordinator.named("dispatch.failed", run_id), 30, "the coordinator's report")
    assert failed["permanent"] is True
    assert dlab.containers() == []
    assert coordinator.proc.poll() is None  # it carries on (backing off)


def test_the_runner_token_is_never_in_docker_inspect(dlab: DockerLab) -> None:
    coordinator = dlab.coordinator()
    run_id = dlab.lab.deploy([{"name": "wait for go", "run": WAIT_FOR_GO}])
    dlab.lab.wait_status(run_id, {"running"})
    [launched] = wait_until(lambda: coordinator.named("worker.launched", run_id), 30, "the launch")

    inspected = dlab.inspect(launched["worker"])
    assert JWT.findall(inspected) == []
    assert '"GANTRY_RUNNER_TOKEN_FILE=/tmp/gantry-runner-token"' in inspected
    assert "GANTRY_RUNNER_TOKEN=" not in inspected
    # The runner deleted the copied-in file once it had read it.
    [container] = dlab.containers(run_id=run_id)
    assert container.exec_run(["test", "-e", "/tmp/gantry-runner-token"]).exit_code == 1

    (dlab.shared / "go").touch()
    assert dlab.lab.wait_terminal(run_id)["status"] == "succeeded"  # so the token did reach the runner


def test_two_coordinators_of_different_groups_never_touch_each_others_containers(dlab: DockerLab) -> None:
    other = dlab.other_group("b")
    mine = dlab.coordinator()
    theirs = dlab.coordinator(lab=other)
    my_run = dlab.lab.deploy([{"name": "wait", "run": WAIT_FOR_GO.replace("/shared/go", "/shared/go-mine")}])
    their_run = other.deploy([{"name": "wait", "run": WAIT_FOR_GO.replace("/shared/go", "/shared/go-theirs")}])
    dlab.lab.wait_status(my_run, {"running"})
    other.wait_status(their_run, {"running"})

    # Both restart (killed outright): each re-attaches to its own container only.
    for coordinator in (mine, theirs):
        coordinator.proc.send_signal(signal.SIGKILL)
        coordinator.proc.wait(30)
    mine = dlab.coordinator(state_dir=mine.state_dir)
    theirs = dlab.coordinator(lab=other, state_dir=theirs.state_dir)
    wait_until(lambda: mine.named("worker.reattached") and theirs.named("worker.reattached"), 30, "the re-attaches")
    assert [e["run_id"] for e in mine.named("worker.reattached")] == [my_run]
    assert [e["run_id"] for e in theirs.named("worker.reattached")] == [their_run]

    # Mine ends and is reaped and removed; theirs runs on, untouched.
    (dlab.shared / "go-mine").touch()
    assert dlab.lab.wait_terminal(my_run)["status"] == "succeeded"
    wait_until(lambda: mine.named("worker.exited"), 30, "my worker to be reaped")
    wait_until(lambda: not dlab.containers(run_id=my_run), 30, "my container to be removed")
    [their_container] = dlab.containers(group_id=other.group_id)
    assert their_container.status == "running"
    assert their_container.labels["gantry.io/run-id"] == their_run
    assert other.run(their_run)["status"] == "running"

    (dlab.shared / "go-theirs").touch()
    assert other.wait_terminal(their_run)["status"] == "succeeded"
    wait_until(lambda: theirs.named("worker.exited"), 30, "their worker to be reaped")
    assert [e["run_id"] for e in mine.named("worker.exited")] == [my_run]
    assert [e["run_id"] for e in theirs.named("worker.exited")] == [their_run]
