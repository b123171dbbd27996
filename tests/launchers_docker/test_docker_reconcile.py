"""The coordinator's reconcile with the Docker launcher: a runner killed in its container, a run cancelled
while its container still starts.

The same two cases as tests/runners/test_reconcile_e2e.py (the local launcher),
here with real containers. The latencies are printed (``-s``), not asserted:
the assertions prove the path (the run failed through the reconcile's
``runner_exited``, not through a reaper an hour later).
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.test_runs import kinds
from tests.launchers_docker.conftest import RUNNER_IMAGE, DockerLab

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

SLOW_IMAGE = "gantry-runner:slow-start"


@pytest.fixture
def slow_image(dlab: DockerLab) -> Iterator[str]:
    """The runner image with a start two minutes late: a worker that is "still starting" for the test.

    Built from the local runner image, so no registry is asked.
    """
    dockerfile = f'FROM {RUNNER_IMAGE}\nENTRYPOINT ["sh", "-c", "sleep 120; exec python3 -m runners.ephemeral"]\n'
    dlab.client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=SLOW_IMAGE, rm=True, network_mode="none")
    return SLOW_IMAGE


def _ts(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["ts"]).timestamp()


def test_a_runner_killed_in_its_container_fails_its_run_at_once_and_the_lane_moves_on(dlab: DockerLab) -> None:
    step = "echo before-the-kill; sleep 2; date +%s.%N > /shared/killed-at; kill -KILL $PPID; sleep 60; echo never"
    doomed = dlab.lab.deploy([{"name": "doomed", "run": step}])
    following = dlab.lab.deploy([{"name": "next", "run": "echo the next run"}])
    assert dlab.lab.run(following)["status"] == "queued"
    coordinator = dlab.coordinator()

    run = dlab.lab.wait_terminal(doomed, timeout=180)

    latency = datetime.fromisoformat(run["finished_at"]).timestamp() - float((dlab.shared / "killed-at").read_text())
    print(f"\n[reconcile, docker] kill -> run failed: {latency:.2f} s")
    assert run["status"] == "failure"
    assert run["failure_reason"].startswith("runner lost: the worker ")
    assert kinds(run).count("runner_exited") == 1
    text, _ = dlab.lab.read_log(doomed)
    assert "before-the-kill" in text  # the live log became the final chunk
    assert "never" not in text
    assert text.endswith("[gantry: the runner was lost; any output after this point is missing]\n")
    [exited] = wait_until(lambda: coordinator.named("worker.exited", doomed), 30, "the worker to be reaped")
    assert exited["exit_code"] != 0
    # The lane moved on: the next run was promoted, claimed and run in a container of its own.
    assert dlab.lab.wait_terminal(following, timeout=180)["status"] == "succeeded"
    wait_until(lambda: not dlab.containers(run_id=doomed), 30, "the dead container to be removed")


def test_a_run_cancelled_while_its_container_starts_has_the_container_stopped(dlab: DockerLab, slow_image: str) -> None:
    coordinator = dlab.coordinator(f"image={slow_image}")
    run_id = dlab.lab.deploy([{"name": "never", "run": "echo should not run"}])
    wait_until(lambda: coordinator.named("worker.launched", run_id), 60, "the launch")
    [container] = dlab.containers(run_id=run_id)
    assert container.status == "running"

    cancelled_at = time.time()
    dlab.lab.api.cancel_run(run_id)
    assert dlab.lab.run(run_id)["status"] == "cancelled"

    [stopping] = wait_until(lambda: coordinator.named("worker.stopping", run_id), 60, "the stop order")
    [exited] = wait_until(lambda: coordinator.named("worker.exited", run_id), 60, "the container to stop")
    print(f"\n[reconcile, docker] cancel -> stop order: {_ts(stopping) - cancelled_at:.2f} s, "
          f"-> container exited: {_ts(exited) - cancelled_at:.2f} s")  # fmt: skip
    assert (stopping["reason"], stopping["run_status"]) == ("run_terminal", "cancelled")
    wait_until(lambda: not dlab.containers(run_id=run_id), 60, "the container to be removed")
    assert dlab.lab.run(run_id)["status"] == "cancelled"
    assert "should not run" not in dlab.lab.read_log(run_id)[0]
