"""Runs end to end through the Kubernetes launcher: a real Gantry server and coordinator, a fake cluster.

The coordinator is the real one (``--launcher kubernetes``), talking through
the official client to the fake API server of tests/k8s, whose kubelet runs
each Pod's ``python3 -m runners.ephemeral`` as a local process; that runner
reaches the gunicorn server over HTTP exactly as a runner in a Pod would.
"""

from __future__ import annotations

import base64
import json
import signal
from pathlib import Path

import launchers
from launchers.kubernetes import KubernetesLauncher
from tests.e2e.conftest import Coordinator, Lab, wait_until
from tests.e2e.test_runs import kinds
from tests.k8s import fixtures
from tests.k8s.fake_apiserver import FakeCluster
from tests.k8s.fixtures import NAMESPACE, RUNNER_IMAGE, SLOW_IMAGE

cluster = fixtures.cluster
RUN_ID = "gantry.io/run-id"


def k8s_coordinator(lab: Lab, *options: str, image: str = RUNNER_IMAGE) -> Coordinator:
    args = ["--launcher", "kubernetes", "--launcher-option", f"image={image}"]
    for option in options:
        args += ["--launcher-option", option]
    return lab.coordinator(*args)


def only_pod(cluster: FakeCluster, run_id: str) -> dict[str, object]:
    [pod] = wait_until(lambda: cluster.created_pods(**{RUN_ID: run_id}), 60, f"a pod for run {run_id}")
    return pod


def gone(cluster: FakeCluster, name: str) -> bool:
    return cluster.pod(NAMESPACE, name) is None and cluster.secret(NAMESPACE, f"{name}-token") is None


def test_a_run_succeeds_in_a_pod(cluster: FakeCluster, lab: Lab) -> None:
    coordinator = k8s_coordinator(lab)
    run_id = lab.deploy([{"name": "hello", "run": 'echo "hello from run $GANTRY_RUN_ID"'}])

    run = lab.wait_terminal(run_id)
    assert run["status"] == "succeeded", run
    pod = only_pod(cluster, run_id)
    name = pod["metadata"]["name"]  # type: ignore[index]
    text, _ = lab.read_log(run_id)
    assert text.startswith(f"==> [1/1] hello\nhello from run {run_id}\n")
    [exited] = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the pod to be reaped")
    assert exited["exit_code"] == 0
    [launched] = coordinator.named("worker.launched", run_id)
    assert launched["msg"] == f"launched kubernetes worker {name} for run {run_id}"
    wait_until(lambda: gone(cluster, name), 30, "the pod and its secret to be deleted")
    # The runner token was only ever in the Secret.
    [secret] = [o for o in cluster.created if o["kind"] == "Secret"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token.count(".") == 2
    assert token not in json.dumps(cluster.created_pods())
    # The runner's own log is the container's (pods/log while the Pod lasts).
    assert '"event": "runner.exit"' in cluster.kubelet.log_text(name)


def test_a_failing_step_is_the_pods_exit_code(cluster: FakeCluster, lab: Lab) -> None:
    coordinator = k8s_coordinator(lab)
    run_id = lab.deploy([{"name": "boom", "run": "echo about to fail; exit 7"}])

    run = lab.wait_terminal(run_id)
    assert run["status"] == "failure"
    assert run["exit_code"] == 7
    [exited] = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the pod to be reaped")
    assert exited["exit_code"] == 1  # the runner's "the run failed", read from the container's state
    assert "about to fail" in lab.read_log(run_id)[0]


def test_an_image_that_will_not_pull_is_dispatch_failed_with_kubernetes_message(cluster: FakeCluster, lab: Lab) -> None:
    coordinator = k8s_coordinator(lab, "startup_grace=2", image="registry.invalid/gantry-runner:nope")
    run_id = lab.deploy([{"name": "never", "run": "echo never"}])

    run = lab.wait_terminal(run_id)
    name = only_pod(cluster, run_id)["metadata"]["name"]  # type: ignore[index]
    assert run["status"] == "failure"
    assert run["failure_reason"].startswith(f"dispatch failed: Pod {NAMESPACE}/{name} cannot start its runner: ")
    assert "dispatch_failed" in kinds(run)
    group = lab.api.request("GET", f"/api/v1/runner-groups/{lab.group_id}").json()
    error = group["last_dispatch_error"]
    assert "registry.invalid/gantry-runner:nope" in error
    assert "ErrImagePull" in error or "ImagePullBackOff" in error
    assert 'failed to resolve reference "registry.invalid/gantry-runner:nope"' in error  # containerd's own words
    [failed] = coordinator.named("dispatch.failed", run_id)
    assert failed["permanent"] is True
    assert gone(cluster, name)
    assert len(cluster.created_pods(**{RUN_ID: run_id})) == 1  # never re-created


def test_a_run_cancelled_while_its_pod_is_pending_has_the_pod_deleted(
    cluster: FakeCluster, lab: Lab, tmp_path: Path
) -> None:
    coordinator = k8s_coordinator(lab, image=SLOW_IMAGE)
    run_id = lab.deploy([{"name": "never", "run": "echo never"}])
    pod = only_pod(cluster, run_id)
    name = str(pod["metadata"]["name"])  # type: ignore[index]
    group = pod["metadata"]["labels"]["gantry.io/group-id"]  # type: ignore[index]
    wait_until(lambda: (cluster.pod(NAMESPACE, name) or {}).get("status", {}).get("containerStatuses"), 30,
               "the pod to be scheduled")  # fmt: skip
    assert cluster.pod(NAMESPACE, name)["status"]["phase"] == "Pending"  # type: ignore[index]

    lab.api.cancel_run(run_id)
    assert lab.wait_terminal(run_id)["status"] == "cancelled"
    # What the coordinator's reconcile does with a worker whose run no longer needs it.
    launcher = launchers.create("kubernetes", state_dir=tmp_path / "other", options={"image": SLOW_IMAGE})
    assert isinstance(launcher, KubernetesLauncher)
    launcher.group_id = group
    try:
        [handle] = [h for h in launcher.discover() if h.run_id == run_id]
        launcher.terminate(handle)
    finally:
        launcher.close()
    wait_until(lambda: gone(cluster, name), 30, "the pending pod and its secret to be deleted")
    [exited] = wait_until(lambda: coordinator.named("worker.exited", run_id), 30, "the coordinator to notice")
    assert exited["exit_code"] is None
    assert lab.run(run_id)["status"] == "cancelled"


def test_a_restarted_coordinator_reattaches_to_its_pod_and_the_run_completes_once(
    cluster: FakeCluster, lab: Lab
) -> None:
    first = k8s_coordinator(lab)
    go = lab.tmp / "go"
    run_id = lab.deploy(
        [{"name": "wait for go", "run": f"echo waiting; while [ ! -f {go} ]; do sleep 0.1; done; echo went"}]
    )
    lab.wait_status(run_id, {"running"})
    name = only_pod(cluster, run_id)["metadata"]["name"]  # type: ignore[index]

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    second = k8s_coordinator(lab)
    [reattached] = wait_until(lambda: second.named("worker.reattached", run_id), 30, "the re-attach")
    assert reattached["msg"] == f"re-attached to kubernetes worker {name} for run {run_id}"

    go.touch()
    run = lab.wait_terminal(run_id)
    assert run["status"] == "succeeded"
    assert kinds(run).count("accepted") == 1
    assert kinds(run).count("finished") == 1
    [exited] = wait_until(lambda: second.named("worker.exited", run_id), 30, "the re-attached pod to be reaped")
    assert exited["exit_code"] == 0  # from the container's terminated state
    assert "went" in lab.read_log(run_id)[0]
    assert len(cluster.created_pods(**{RUN_ID: run_id})) == 1
    wait_until(lambda: gone(cluster, name), 30, "the pod and its secret to be deleted")
