"""The Kubernetes launcher against the fake API server, through the official client (no Gantry server).

What the launcher sends (the Pod, its Secret, the merge with ``pod_template``),
how it reads Pods back (discover, is_alive, startup failures, last lines, exit
codes) and how it words Kubernetes' refusals. Runs end to end through a real
Gantry server and coordinator are in tests/e2e/test_kubernetes.py.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import launchers
from launchers.base import Assignment, LaunchError, WorkerHandle
from launchers.kubernetes import KubernetesLauncher
from tests.e2e.conftest import wait_until
from tests.k8s.fake_apiserver import FakeCluster
from tests.k8s.fake_kubelet import FakeImage
from tests.k8s.fixtures import NAMESPACE, ROOT, RUNNER_IMAGE, SLOW_IMAGE
from tests.ports import free_port

TOKEN = "eyJhbGciOiJIUzI1NiJ9.runner-token-under-test.c2lnbmF0dXJl"
Make = Callable[..., KubernetesLauncher]


@pytest.fixture
def make(cluster: FakeCluster, tmp_path: Path) -> Iterator[Make]:
    made: list[KubernetesLauncher] = []

    def build(group: str = "7", **options: str) -> KubernetesLauncher:
        options.setdefault("image", SLOW_IMAGE)
        launcher = launchers.create("kubernetes", state_dir=tmp_path / "state", options=options)
        assert isinstance(launcher, KubernetesLauncher)
        launcher.group_id = group
        made.append(launcher)
        return launcher

    yield build
    for launcher in made:
        launcher.close()


def assignment(n: int = 1, group: str = "7", server: str = "http://127.0.0.1:9") -> Assignment:
    return Assignment(
        server=server,
        run_id=f"{n:08d}-0000-4000-8000-000000000000",
        runner_id=f"{n:08x}-1111-4111-8111-111111111111",
        runner_token=TOKEN,
        group_id=group,
    )


def unreachable() -> str:
    return f"http://127.0.0.1:{free_port()}"


def pod_of(cluster: FakeCluster, handle: WorkerHandle) -> dict[str, Any]:
    found = cluster.pod(NAMESPACE, handle.ident)
    assert found is not None, f"pod {handle.ident} is gone"
    return found


def runner_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "runner")


def runner_image_user() -> tuple[int, int]:
    """The runner image's ``USER uid:gid`` (runners/Dockerfile)."""
    [line] = [x for x in (ROOT / "runners" / "Dockerfile").read_text().splitlines() if x.startswith("USER ")]
    uid, gid = line.split()[1].split(":")
    return int(uid), int(gid)


# ---------------------------------------------------------------- options


def test_unknown_and_bad_options_are_refused(make: Make, tmp_path: Path) -> None:
    for options, words in (
        ({"imag": "x"}, "unknown kubernetes launcher options: imag"),
        ({"image": ""}, "needs --launcher-option image=IMAGE"),
        ({"cpu_limit": "two"}, "cpu_limit='two' is not a Kubernetes quantity"),
        ({"image_pull_policy": "Sometimes"}, "image_pull_policy must be one of"),
        ({"node_selector": "disk"}, "node_selector takes key=value"),
        ({"startup_grace": "soon"}, "startup_grace='soon' is not a number"),
        ({"active_deadline_seconds": "0"}, "active_deadline_seconds must be at least 1"),
        ({"pod_template": str(tmp_path / "absent.yaml")}, "pod_template"),
        ({"namespace": "elsewhere"}, 'namespaces "elsewhere" not found'),
    ):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
            make(**options)


def test_the_coordinator_exits_2_on_an_unknown_option(cluster: FakeCluster, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runners.coordinator", "--server", unreachable(), "--token", "t", "--launcher",
         "kubernetes", "--launcher-option", f"image={RUNNER_IMAGE}", "--launcher-option", "colour=blue",
         "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "unknown kubernetes launcher options: colour" in result.stderr


def test_a_refused_runner_pod_stops_the_start_and_an_absent_api_server_does_not(
    make: Make, cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.forbid("create", "pods")
    with pytest.raises(ValueError, match='cannot create resource "pods"'):
        make()
    assert cluster.created == []  # a dry run

    nowhere = cluster.write_kubeconfig(tmp_path / "nowhere.kubeconfig", server=unreachable())
    monkeypatch.setenv("KUBECONFIG", str(nowhere))
    assert make().namespace == "default"  # it may come up later: start anyway

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(ValueError, match="no usable Kubernetes configuration"):
        make()


def test_the_namespace_comes_from_the_option_else_the_kubeconfig_context(make: Make) -> None:
    assert make().namespace == NAMESPACE
    assert make(namespace="default").namespace == "default"


# ---------------------------------------------------------------- what is created


def test_the_pod_is_labelled_and_its_token_is_only_in_an_owned_secret(make: Make, cluster: FakeCluster) -> None:
    launcher = make(
        server_url="http://gantry.internal:8000",
        cpu_request="250m",
        memory_limit="1Gi",
        node_selector="disk=ssd,zone=a",
        image_pull_policy="IfNotPresent",
        active_deadline_seconds="3600",
    )
    job = assignment()
    handle = launcher.launch(job)

    pod = pod_of(cluster, handle)
    assert handle.ident == pod["metadata"]["name"] == f"gantry-{job.run_id}-{job.runner_id[:8]}"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gantry",
        "app.kubernetes.io/name": "gantry-runner",
        "gantry.io/group-id": "7",
        "gantry.io/run-id": job.run_id,
        "gantry.io/runner-id": job.runner_id,
    }
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"] == {"disk": "ssd", "zone": "a"}
    assert spec["activeDeadlineSeconds"] == 3600
    runner = runner_container(pod)
    assert runner["image"] == SLOW_IMAGE
    assert runner["imagePullPolicy"] == "IfNotPresent"
    assert runner["command"] == ["python3", "-m", "runners.ephemeral"]
    assert runner["resources"] == {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}}
    env = {e["name"]: e["value"] for e in runner["env"]}
    assert env["GANTRY_SERVER"] == "http://gantry.internal:8000"
    assert env["GANTRY_RUN_ID"] == job.run_id
    assert env["GANTRY_RUNNER_ID"] == job.runner_id
    assert env["GANTRY_RUNNER_TOKEN_FILE"] == "/var/run/gantry/runner-token/token"
    # The token: nowhere in the Pod as the API stores it (env, args, labels, annotations, status).
    assert TOKEN not in json.dumps(pod)
    assert all(TOKEN not in json.dumps(p) for p in cluster.created_pods())

    secret = cluster.secret(NAMESPACE, f"{handle.ident}-token")
    assert secret is not None
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": handle.ident, "uid": pod["metadata"]["uid"]}
    ]
    assert secret["immutable"] is True
    assert secret["data"] == {"token": base64.b64encode(TOKEN.encode()).decode()}
    # The Secret reaches only the hand-over init container; the runner gets its copy in a memory volume.
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes == {
        "gantry-runner-token-secret": {"name": "gantry-runner-token-secret",
                                       "secret": {"secretName": secret["metadata"]["name"], "defaultMode": 0o400}},
        "gantry-runner-token": {"name": "gantry-runner-token", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    }  # fmt: skip
    assert runner["volumeMounts"] == [
        {"name": "gantry-runner-token", "mountPath": "/var/run/gantry/runner-token", "readOnly": False}
    ]
    [handover] = spec["initContainers"]
    assert handover["name"] == "runner-token"
    assert handover["image"] == runner["image"]
    assert handover["imagePullPolicy"] == "IfNotPresent"
    assert handover["resources"] == runner["resources"]
    assert {m["name"]: m.get("readOnly") for m in handover["volumeMounts"]} == {
        "gantry-runner-token-secret": True, "gantry-runner-token": None,
    }  # fmt: skip
    assert handover["securityContext"]["allowPrivilegeEscalation"] is False
    # The Secret's root-owned file is readable by the runner image's group (runners/Dockerfile).
    assert spec["securityContext"] == {"fsGroup": runner_image_user()[1]}
    # Created in that order: the Secret needs the Pod's uid.
    assert [o["kind"] for o in cluster.created] == ["Pod", "Secret"]


def test_pod_template_lies_under_gantrys_fields(make: Make, cluster: FakeCluster, tmp_path: Path) -> None:
    template = tmp_path / "template.yaml"
    template.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ignored", "labels": {"team": "infra", "gantry.io/run-id": "forged"},
                     "annotations": {"cost-centre": "42"}},
        "spec": {
            "restartPolicy": "Always",
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}],
            "securityContext": {"runAsNonRoot": True},
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "containers": [
                {"name": "runner", "image": "not-this:1", "command": ["evil"], "args": ["--steal"],
                 "env": [{"name": "HTTP_PROXY", "value": "http://proxy:3128"},
                         {"name": "GANTRY_RUN_ID", "value": "forged"}],
                 "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                 "resources": {"limits": {"cpu": "2"}}},
                {"name": "sidecar", "image": "busybox:1", "command": ["sleep", "infinity"]},
            ],
        },
    }))  # fmt: skip
    handle = make(pod_template=str(template), memory_limit="512Mi").launch(assignment())

    pod = pod_of(cluster, handle)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == handle.ident
    assert meta["labels"]["team"] == "infra"
    assert meta["annotations"]["cost-centre"] == "42"
    assert meta["labels"]["gantry.io/run-id"] == handle.run_id
    assert spec["restartPolicy"] == "Never"
    assert spec["tolerations"][0]["key"] == "dedicated"
    assert spec["securityContext"] == {"runAsNonRoot": True, "fsGroup": runner_image_user()[1]}
    assert sorted(v["name"] for v in spec["volumes"]) == ["cache", "gantry-runner-token", "gantry-runner-token-secret"]
    assert [c["name"] for c in spec["containers"]] == ["runner", "sidecar"]
    runner = runner_container(pod)
    assert runner["image"] == SLOW_IMAGE
    assert runner["command"] == ["python3", "-m", "runners.ephemeral"]
    assert runner["args"] == []
    env = {e["name"]: e["value"] for e in runner["env"]}
    assert env["HTTP_PROXY"] == "http://proxy:3128"
    assert env["GANTRY_RUN_ID"] == handle.run_id
    assert sorted(m["mountPath"] for m in runner["volumeMounts"]) == ["/cache", "/var/run/gantry/runner-token"]
    assert runner["resources"] == {"limits": {"cpu": "2", "memory": "512Mi"}}


def test_the_runner_token_is_handed_over_readable_by_the_runners_user_alone_then_deleted(
    make: Make, cluster: FakeCluster, tmp_path: Path
) -> None:
    # The runner container waits for a Secret of the template's, so the handed-over file stays to look at.
    template = tmp_path / "template.yaml"
    template.write_text(yaml.safe_dump({"spec": {"containers": [{"name": "runner", "env": [
        {"name": "DEPLOY_KEY", "valueFrom": {"secretKeyRef": {"name": "deploy-key", "key": "key"}}}]}]}}))  # fmt: skip
    launcher = make(image=RUNNER_IMAGE, pod_template=str(template), server_url=unreachable())
    handle = launcher.launch(assignment())
    uid = pod_of(cluster, handle)["metadata"]["uid"]

    def waiting_for_the_key() -> bool:
        [runner] = pod_of(cluster, handle)["status"]["containerStatuses"]
        return runner["state"].get("waiting", {}).get("reason") == "CreateContainerConfigError"

    wait_until(waiting_for_the_key, 30, "the hand-over to finish and the runner to wait for its key")
    [handover] = pod_of(cluster, handle)["status"]["initContainerStatuses"]
    assert handover["state"]["terminated"]["exitCode"] == 0
    volumes = cluster.kubelet.runtimes[uid].volumes
    assert volumes is not None
    copied = volumes["gantry-runner-token"] / "token"
    assert copied.read_text() == TOKEN
    # Owned by the user the hand-over ran as (the node's, standing for the image's), for that user alone.
    assert copied.stat().st_uid == os.getuid()
    assert stat.S_IMODE(copied.stat().st_mode) == 0o400
    assert stat.S_IMODE((volumes["gantry-runner-token-secret"] / "token").stat().st_mode) == 0o400

    with cluster.lock:
        cluster.secrets[(NAMESPACE, "deploy-key")] = {
            "metadata": {"name": "deploy-key", "namespace": NAMESPACE}, "data": {"key": "a2V5"},
        }  # fmt: skip
    # The runner starts, reads the file and deletes it before anything else (its steps never see it).
    wait_until(lambda: not copied.exists(), 30, "the runner to take the token's file")
    assert launcher.startup_failure(handle) is None


def test_a_failed_hand_over_is_a_startup_failure(make: Make, cluster: FakeCluster, tmp_path: Path) -> None:
    # A template that mounts a file at the copy's path: the hand-over refuses to write over it.
    template = tmp_path / "template.yaml"
    template.write_text(yaml.safe_dump({"spec": {
        "volumes": [{"name": "planted", "secret": {"secretName": "planted"}}],
        "initContainers": [{"name": "runner-token", "volumeMounts": [
            {"name": "planted", "mountPath": "/var/run/gantry/runner-token/token", "subPath": "token"}]}],
    }}))  # fmt: skip
    with cluster.lock:
        cluster.secrets[(NAMESPACE, "planted")] = {
            "metadata": {"name": "planted", "namespace": NAMESPACE}, "data": {"token": "eA=="},
        }  # fmt: skip
    launcher = make(image=RUNNER_IMAGE, pod_template=str(template))
    handle = launcher.launch(assignment())
    wait_until(lambda: pod_of(cluster, handle)["status"]["phase"] == "Failed", 30, "the hand-over to fail")

    assert launcher.is_alive(handle)  # the runner never ran: a launch that failed, not an exited runner
    failure = launcher.startup_failure(handle)
    assert failure is not None
    assert failure.permanent
    assert "InitError: the runner token's hand-over (runner-token init container) exited with code 1" in (
        failure.message
    )


# ---------------------------------------------------------------- discover, terminate, reap


def test_discover_finds_this_groups_pods_only(make: Make, cluster: FakeCluster) -> None:
    mine, theirs = make(group="7"), make(group="8")
    launched = mine.launch(assignment(1))
    theirs.launch(assignment(2, group="8"))

    restarted = make(group="7")
    [found] = restarted.discover()
    assert (found.ident, found.run_id, found.runner_id) == (launched.ident, launched.run_id, launched.runner_id)
    assert restarted.is_alive(found)
    assert len(cluster.pods) == 2  # the other group's Pod untouched


def test_terminate_deletes_a_pending_pod_and_its_secret_goes_with_it(make: Make, cluster: FakeCluster) -> None:
    launcher = make()
    handle = launcher.launch(assignment())
    wait_until(lambda: pod_of(cluster, handle)["status"].get("containerStatuses"), 30, "the pod to be scheduled")
    assert pod_of(cluster, handle)["status"]["phase"] == "Pending"
    secret = f"{handle.ident}-token"
    assert cluster.secret(NAMESPACE, secret) is not None

    launcher.terminate(handle, grace=5)
    assert cluster.pod(NAMESPACE, handle.ident) is None  # nothing ran: gone at once
    assert ("pods", handle.ident, 5) in cluster.deleted
    # The garbage collector follows the ownerReference; the launcher does not need to.
    assert ("secrets", secret, None) not in cluster.deleted
    wait_until(lambda: cluster.secret(NAMESPACE, secret) is None, 30, "the owned secret to go with its pod")
    assert not launcher.is_alive(handle)
    assert launcher.reap(handle) is None


def test_reap_deletes_the_secret_where_no_garbage_collector_runs(make: Make, cluster: FakeCluster) -> None:
    cluster.gc = False
    launcher = make()
    handle = launcher.launch(assignment())
    launcher.terminate(handle, grace=0)
    assert cluster.secret(NAMESPACE, f"{handle.ident}-token") is not None
    launcher.reap(handle)
    assert cluster.secret(NAMESPACE, f"{handle.ident}-token") is None


def test_an_evicted_pod_is_reaped_never_recreated_and_says_why(make: Make, cluster: FakeCluster) -> None:
    launcher = make(image=RUNNER_IMAGE)
    job = assignment(server=unreachable())
    handle = launcher.launch(job)
    wait_until(lambda: pod_of(cluster, handle)["status"]["phase"] == "Running", 30, "the pod to run")

    cluster.kubelet.evict(NAMESPACE, handle.ident)
    assert not launcher.is_alive(handle)
    lines = launcher.last_lines(handle)
    assert lines[-1] == f"[kubernetes] Pod {handle.ident} Failed: Evicted: The node was low on resource: memory."
    assert launcher.reap(handle) == 137
    assert cluster.pod(NAMESPACE, handle.ident) is None
    assert cluster.secret(NAMESPACE, f"{handle.ident}-token") is None
    # One Pod for the run, ever: neither the reap nor a restarted coordinator's discover creates one.
    assert make().discover() == []
    assert len(cluster.created_pods(**{"gantry.io/run-id": job.run_id})) == 1


def test_a_finished_pod_found_at_start_is_reaped_with_its_exit_code(
    make: Make, cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # No server URL at all: the runner refuses its configuration (argparse's exit 2).
    launcher = make(image=RUNNER_IMAGE)
    handle = launcher.launch(assignment(server=""))
    wait_until(lambda: pod_of(cluster, handle)["status"]["phase"] == "Failed", 60, "the runner to give up")
    # Its own words, through pods/log.
    assert "missing: --server" in "\n".join(launcher.last_lines(handle, limit=5))

    with caplog.at_level("INFO", logger="gantry.launcher.kubernetes"):
        assert make().discover() == []  # reaped there and then
    [exited] = [r for r in caplog.records if getattr(r, "event", "") == "worker.exited"]
    assert exited.run_id == handle.run_id
    assert exited.exit_code == 2
    assert cluster.pod(NAMESPACE, handle.ident) is None
    assert "missing: --server" in cluster.kubelet.log_text(handle.ident)


# ---------------------------------------------------------------- startup guards


def test_an_image_that_will_not_pull_is_a_startup_failure_after_the_grace(make: Make, cluster: FakeCluster) -> None:
    launcher = make(image="registry.invalid/gantry-runner:missing", startup_grace="5")
    handle = launcher.launch(assignment())

    def pull_failed() -> bool:
        # The token's hand-over runs the image first: the kubelet says so of that init container.
        statuses = pod_of(cluster, handle)["status"].get("initContainerStatuses") or [{"state": {}}]
        return statuses[0]["state"].get("waiting", {}).get("reason") == "ErrImagePull"

    wait_until(pull_failed, 30, "the pull to fail")
    assert launcher.is_alive(handle)
    assert launcher.startup_failure(handle) is None  # within the grace

    failure = wait_until(lambda: launcher.startup_failure(handle), 30, "the grace to pass")
    assert isinstance(failure, LaunchError)
    assert failure.permanent
    assert failure.message.startswith(f"Pod {NAMESPACE}/{handle.ident} cannot start its runner: ")
    assert "registry.invalid/gantry-runner:missing" in failure.message
    assert "ErrImagePull" in failure.message or "ImagePullBackOff" in failure.message
    assert "not found" in failure.message  # containerd's words, even during the back-off

    # What the coordinator does with it.
    launcher.terminate(handle, grace=0)
    launcher.reap(handle)
    assert cluster.pod(NAMESPACE, handle.ident) is None
    assert cluster.secret(NAMESPACE, f"{handle.ident}-token") is None


def test_a_template_secret_that_is_missing_is_a_create_container_config_error(
    make: Make, cluster: FakeCluster, tmp_path: Path
) -> None:
    template = tmp_path / "template.yaml"
    template.write_text(yaml.safe_dump({"spec": {"containers": [{"name": "runner", "env": [
        {"name": "DEPLOY_KEY", "valueFrom": {"secretKeyRef": {"name": "deploy-key", "key": "key"}}}]}]}}))  # fmt: skip
    launcher = make(image=RUNNER_IMAGE, pod_template=str(template), startup_grace="0")
    handle = launcher.launch(assignment())

    failure = wait_until(lambda: launcher.startup_failure(handle), 30, "the config error")
    assert failure.message.endswith('CreateContainerConfigError: secret "deploy-key" not found')


def test_a_runner_command_missing_from_the_image_fails_the_start_at_once(make: Make, cluster: FakeCluster) -> None:
    cluster.images["python:no-gantry"] = FakeImage(workdir=ROOT, env={"PATH": "/nonexistent"})
    launcher = make(image="python:no-gantry")
    handle = launcher.launch(assignment())
    wait_until(lambda: pod_of(cluster, handle)["status"]["phase"] == "Failed", 30, "the container to fail to start")

    assert launcher.is_alive(handle)  # not an exited runner: a launch that failed
    failure = launcher.startup_failure(handle)
    assert failure is not None
    assert failure.permanent
    # The image's first process is the token's hand-over (the runner's own python3): it is what fails.
    assert "StartError: the runner token's hand-over (runner-token init container) exited with code 128" in (
        failure.message
    )
    assert "failed to create containerd task" in failure.message
    assert 'exec: "python3": executable file not found' in failure.message


def test_a_pod_left_without_its_secret_is_a_startup_failure_after_a_restart(make: Make, cluster: FakeCluster) -> None:
    cluster.gc = False
    cluster.fail_next("create", "secrets", 500)
    cluster.fail_next("delete", "pods", 500)  # and the clean-up fails too: as if the coordinator died there
    launcher = make()
    with pytest.raises(LaunchError):
        launcher.launch(assignment())
    [handle] = make().discover()
    failure = make().startup_failure(handle)
    assert failure is not None
    assert "has no token Secret" in failure.message


# ---------------------------------------------------------------- API errors


def test_api_refusals_are_permanent_and_outages_transient(make: Make, cluster: FakeCluster) -> None:
    launcher = make()
    for verb, resource, code, permanent in (
        ("create", "pods", 403, True),
        ("create", "pods", 500, False),
        ("create", "pods", 503, False),
        ("create", "pods", 429, False),
        ("create", "secrets", 500, False),
        ("create", "secrets", 403, True),
    ):
        cluster.fail_next(verb, resource, code)
        with pytest.raises(LaunchError) as failed:
            launcher.launch(assignment())
        assert failed.value.permanent is permanent, (verb, resource, code)
        assert f"(HTTP {code})" in failed.value.message
        # A failed Secret takes its Pod back: a retried launch starts clean.
        assert cluster.pods == {}
    cluster.forbid("create", "pods")
    with pytest.raises(LaunchError) as forbidden:
        launcher.launch(assignment())
    assert forbidden.value.permanent
    assert 'cannot create resource "pods" in API group "" in the namespace "gantry-runners"' in forbidden.value.message

    cluster.stop()
    with pytest.raises(LaunchError) as down:
        launcher.launch(assignment())
    assert not down.value.permanent
    assert "the Kubernetes API did not answer" in down.value.message


def test_a_create_whose_answer_was_lost_is_adopted_on_retry(make: Make, cluster: FakeCluster) -> None:
    launcher = make()
    first = launcher.launch(assignment())
    del cluster.secrets[(NAMESPACE, f"{first.ident}-token")]  # as if the first attempt died after the Pod
    again = launcher.launch(assignment())
    assert again.ident == first.ident
    assert again.meta["uid"] == first.meta["uid"]
    assert len(cluster.created_pods()) == 1
    assert cluster.secret(NAMESPACE, f"{first.ident}-token") is not None


def test_an_unreadable_pod_is_not_taken_for_dead(make: Make, cluster: FakeCluster) -> None:
    launcher = make()
    handle = launcher.launch(assignment())
    cluster.fail_next("get", "pods", 503, times=3)
    assert launcher.is_alive(handle)
    assert cluster.pod(NAMESPACE, handle.ident) is not None
