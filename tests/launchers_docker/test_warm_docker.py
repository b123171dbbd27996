"""Warm runners with the Docker launcher (``--warm N --launcher docker``), end to end.

A real server, a coordinator as a subprocess, runner containers on the real
engine: a warm container waits holding nothing, takes a claim through its
stdin and runs it as a cold container would; one that dies while waiting is
replaced and no run is touched; shutdown removes the idle ones; a coordinator
killed outright is succeeded by one that re-attaches to the container that
took a claim and removes the idle one it left.
"""

from __future__ import annotations

import re
import signal
from typing import Any

import pytest

from launchers.docker import LABEL_GROUP, LABEL_MANAGED, LABEL_RUN, LABEL_WARM
from tests.e2e.conftest import Coordinator, wait_until
from tests.launchers_docker.conftest import DockerLab

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
WAIT_FOR_GO = "echo waiting; while [ ! -f /shared/go ]; do sleep 0.1; done; echo went"


def warm_containers(dlab: DockerLab, *, idle: bool = True) -> list[Any]:
    """The group's warm containers: the idle ones (still named gantry-warm-...), or all that started warm."""
    selector = [f"{LABEL_MANAGED}=true", f"{LABEL_GROUP}={dlab.lab.group_id}", LABEL_WARM]
    found = dlab.client.containers.list(all=True, filters={"label": selector}, ignore_removed=True)
    return [c for c in found if not idle or c.name.startswith("gantry-warm-")]


def running_idle(dlab: DockerLab) -> list[Any]:
    return [c for c in warm_containers(dlab) if c.status == "running"]


def start(dlab: DockerLab, warm_n: int) -> Coordinator:
    coordinator = dlab.coordinator(args=["--warm", str(warm_n), "--reconcile-interval", "1"])
    wait_until(lambda: len(running_idle(dlab)) == warm_n, 60, f"{warm_n} warm container(s)")
    return coordinator


def test_a_warm_container_holds_nothing_then_takes_a_claim_and_the_run_succeeds(dlab: DockerLab) -> None:
    coordinator = start(dlab, 1)
    [warm] = running_idle(dlab)
    # Waiting, it holds no run and no credential: nothing of a run in its labels, environment or command.
    text = dlab.inspect(warm.id)
    assert LABEL_RUN not in warm.labels
    assert "GANTRY_RUN_ID" not in text
    assert "GANTRY_RUNNER_TOKEN" not in text
    assert not JWT.search(text)
    assert warm.attrs["Config"]["Cmd"] == ["--warm", warm.labels[LABEL_WARM]]
    assert warm.attrs["Config"]["User"] == "10001:10001"

    # The step waits for a go, so the container is still there to inspect while it runs its run (once the
    # run ends the coordinator reaps and removes it within moments).
    who = 'echo "uid $(id -u) token ${GANTRY_RUNNER_TOKEN:-none}"; ' + WAIT_FOR_GO
    run_id = dlab.lab.deploy([{"name": "who", "run": who}])
    wait_until(lambda: "waiting" in dlab.lab.log_so_far(run_id), 60, "the run to start")
    [launched] = coordinator.named("worker.launched", run_id)
    assert launched["warm"] is True
    assert launched["worker"] == warm.short_id
    # The container that runs it is the warm one, renamed for its run; still no token in its configuration.
    warm.reload()
    assert warm.name == f"gantry-{launched['runner_id']}.run-{run_id}"
    assert not JWT.search(dlab.inspect(warm.id))
    (dlab.shared / "go").touch()
    run = dlab.lab.wait_terminal(run_id)
    assert run["status"] == "succeeded", run
    assert "uid 10001 token none\n" in dlab.lab.read_log(run_id)[0]
    [exited] = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the worker to be reaped")
    assert exited["exit_code"] == 0
    wait_until(lambda: warm.short_id not in [c.short_id for c in warm_containers(dlab, idle=False)], 30,
               "the container to be removed")  # fmt: skip
    # The used warm container was replaced.
    wait_until(lambda: len(running_idle(dlab)) == 1, 60, "a replacement warm container")
    assert len(coordinator.named("warm.started")) == 2


def test_a_warm_container_killed_while_waiting_is_replaced_and_no_run_is_touched(dlab: DockerLab) -> None:
    coordinator = start(dlab, 1)
    busy = dlab.lab.deploy([{"name": "wait", "run": WAIT_FOR_GO}])
    wait_until(lambda: "waiting" in dlab.lab.log_so_far(busy), 60, "the busy run to start")
    wait_until(lambda: len(running_idle(dlab)) == 1, 60, "the used warm container's replacement")
    [victim] = running_idle(dlab)

    victim.kill()
    [exited] = wait_until(lambda: coordinator.named("warm.exited"), 30, "the coordinator to see the warm one die")
    assert exited["worker"] == victim.labels[LABEL_WARM]
    wait_until(lambda: [c.id for c in running_idle(dlab)] not in ([], [victim.id]), 60, "a replacement")
    assert victim.id not in [c.id for c in warm_containers(dlab)]  # removed, not left exited
    # The busy run never noticed.
    assert dlab.lab.run(busy)["status"] == "running"
    assert not coordinator.named("dispatch.failed")
    (dlab.shared / "go").touch()
    assert dlab.lab.wait_terminal(busy)["status"] == "succeeded"
    # And the replacement takes the next claim.
    following = dlab.lab.deploy([{"name": "next", "run": "echo next"}])
    assert dlab.lab.wait_terminal(following)["status"] == "succeeded"
    [launched] = coordinator.named("worker.launched", following)
    assert launched["warm"] is True


def test_shutdown_removes_the_idle_warm_containers_and_leaves_a_busy_one_running(dlab: DockerLab) -> None:
    coordinator = start(dlab, 2)
    busy = dlab.lab.deploy([{"name": "wait", "run": WAIT_FOR_GO}])
    wait_until(lambda: "waiting" in dlab.lab.log_so_far(busy), 60, "the busy run to start")
    wait_until(lambda: len(running_idle(dlab)) == 2, 60, "the used warm container's replacement")

    coordinator.proc.send_signal(signal.SIGTERM)
    assert coordinator.proc.wait(60) == 0
    assert [e["count"] for e in coordinator.named("warm.stopped")] == [2]
    assert warm_containers(dlab) == []
    # The worker that took a claim is a worker: shutdown leaves it its run.
    (dlab.shared / "go").touch()
    assert dlab.lab.wait_terminal(busy)["status"] == "succeeded"


def test_a_restarted_coordinator_reattaches_to_a_warm_started_worker_and_removes_idle_leftovers(
    dlab: DockerLab,
) -> None:
    first = start(dlab, 1)
    busy = dlab.lab.deploy([{"name": "wait", "run": WAIT_FOR_GO}])
    wait_until(lambda: "waiting" in dlab.lab.log_so_far(busy), 60, "the busy run to start")
    wait_until(lambda: len(running_idle(dlab)) == 1, 60, "the used warm container's replacement")
    [leftover] = running_idle(dlab)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)

    second = dlab.coordinator(args=["--reconcile-interval", "1"])
    [reattached] = wait_until(lambda: second.named("worker.reattached"), 30, "the re-attach")
    assert reattached["run_id"] == busy
    # The idle one the killed coordinator left holds nothing: gone, and no run was told anything of it.
    wait_until(lambda: leftover.id not in [c.id for c in warm_containers(dlab)], 30, "the idle leftover removed")
    (dlab.shared / "go").touch()
    assert dlab.lab.wait_terminal(busy)["status"] == "succeeded"
    [exited] = wait_until(lambda: second.named("worker.exited", busy), 30, "the worker to be reaped")
    assert exited["exit_code"] == 0
