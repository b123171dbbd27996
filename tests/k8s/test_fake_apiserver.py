"""The fake API server, judged through the official client: its models must parse every answer.

Client-side validation is on (the client's default), so a required field the
fake left out (a container status's ``restartCount``, a condition's
``status``, an owner reference's ``uid``) fails the deserialisation here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e.conftest import wait_until
from tests.k8s.fake_apiserver import FakeCluster
from tests.k8s.fixtures import NAMESPACE, RUNNER_IMAGE


@pytest.fixture
def api(cluster: FakeCluster) -> Iterator[Any]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=configuration)
    api_client = client.ApiClient(configuration)
    yield client.CoreV1Api(api_client)
    api_client.close()


def pod(name: str, command: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": RUNNER_IMAGE, "command": ["sh", "-c", command]}],
            **spec,
        },
    }


def phase(api: Any, name: str) -> str:
    return str(api.read_namespaced_pod(name, NAMESPACE).status.phase)


def waiting(api: Any, name: str) -> tuple[str, str] | None:
    status = api.read_namespaced_pod(name, NAMESPACE).status
    for cstatus in status.container_statuses or []:
        if cstatus.state.waiting is not None:
            return str(cstatus.state.waiting.reason), str(cstatus.state.waiting.message or "")
    return None


def status_of(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


def test_a_pod_runs_to_its_exit_code_and_its_log_is_served(api: Any, cluster: FakeCluster) -> None:
    created = api.create_namespaced_pod(NAMESPACE, pod("p1", "echo one; echo two; echo three; exit 3"))
    assert created.metadata.uid
    assert created.metadata.resource_version
    assert created.metadata.creation_timestamp is not None
    assert created.status.phase == "Pending"
    assert created.spec.containers[0].image_pull_policy == "IfNotPresent"  # a tag that is not :latest

    wait_until(lambda: phase(api, "p1") == "Failed", 30, "the pod to fail")
    got = api.read_namespaced_pod("p1", NAMESPACE)
    [cstatus] = got.status.container_statuses
    assert cstatus.state.terminated.exit_code == 3
    assert cstatus.state.terminated.reason == "Error"
    assert {c.type: c.status for c in got.status.conditions}["Ready"] == "False"
    assert api.read_namespaced_pod_log("p1", NAMESPACE, tail_lines=2) == "two\nthree\n"
    assert api.read_namespaced_pod_log("p1", NAMESPACE, container="main") == "one\ntwo\nthree\n"
    with pytest.raises(ApiException) as refused:
        api.read_namespaced_pod_log("p1", NAMESPACE, container="other")
    assert refused.value.status == 400


def test_list_filters_by_label_selector(api: Any) -> None:
    for name, labels in (("a", {"app": "x", "tier": "1"}), ("b", {"app": "y"}), ("c", {"tier": "2"})):
        api.create_namespaced_pod(NAMESPACE, pod(name, "sleep 30", labels=labels))

    def names(selector: str) -> list[str]:
        listed = api.list_namespaced_pod(NAMESPACE, label_selector=selector)
        assert listed.metadata.resource_version
        return sorted(p.metadata.name for p in listed.items)

    assert names("app=x") == ["a"]
    assert names("app==y") == ["b"]
    assert names("app!=x") == ["b", "c"]
    assert names("app in (x, y)") == ["a", "b"]
    assert names("tier notin (2),app") == ["a", "b"]
    assert names("!app") == ["c"]
    assert names("app=x,tier=1") == ["a"]
    assert names("") == ["a", "b", "c"]
    assert api.list_namespaced_pod("default").items == []


def test_errors_are_status_objects(api: Any, cluster: FakeCluster, tmp_path: Path) -> None:
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod("nope", NAMESPACE)
    assert missing.value.status == 404
    assert status_of(missing.value)["reason"] == "NotFound"
    assert status_of(missing.value)["message"] == 'pods "nope" not found'

    api.create_namespaced_pod(NAMESPACE, pod("dup", "true"))
    with pytest.raises(ApiException) as dup:
        api.create_namespaced_pod(NAMESPACE, pod("dup", "true"))
    assert (dup.value.status, status_of(dup.value)["reason"]) == (409, "AlreadyExists")

    bad = pod("Bad_Name", "true")
    bad["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "lots"}}
    with pytest.raises(ApiException) as invalid:
        api.create_namespaced_pod(NAMESPACE, bad)
    assert (invalid.value.status, status_of(invalid.value)["reason"]) == (422, "Invalid")
    assert "metadata.name" in status_of(invalid.value)["message"]
    assert "resources.limits[cpu]" in status_of(invalid.value)["message"]

    with pytest.raises(ApiException) as no_namespace:
        api.create_namespaced_pod("elsewhere", pod("p", "true"))
    assert status_of(no_namespace.value)["message"] == 'namespaces "elsewhere" not found'

    cluster.forbid("create", "secrets")
    with pytest.raises(ApiException) as forbidden:
        api.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    assert forbidden.value.status == 403
    assert "cannot create resource" in status_of(forbidden.value)["message"]

    stranger = cluster.write_kubeconfig(tmp_path / "stranger", token="not-the-token")
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(stranger), client_configuration=configuration)
    with client.ApiClient(configuration) as other, pytest.raises(ApiException) as unauthorized:
        client.CoreV1Api(other).list_namespaced_pod(NAMESPACE)
    assert unauthorized.value.status == 401


def test_a_dry_run_create_stores_nothing(api: Any, cluster: FakeCluster) -> None:
    answer = api.create_namespaced_pod(NAMESPACE, pod("dry", "true"), dry_run="All")
    assert answer.metadata.name == "dry"
    assert cluster.pod(NAMESPACE, "dry") is None


def test_an_image_that_cannot_be_pulled_waits_in_err_image_pull_then_back_off(api: Any) -> None:
    spec = pod("nopull", "true")
    spec["spec"]["containers"][0]["image"] = "registry.invalid/nope:1"
    api.create_namespaced_pod(NAMESPACE, spec)

    def reason_is(wanted: str) -> Callable[[], tuple[str, str] | None]:
        def check() -> tuple[str, str] | None:
            state = waiting(api, "nopull")
            return state if state is not None and state[0] == wanted else None

        return check

    _, message = wait_until(reason_is("ErrImagePull"), 30, "the pull to fail")
    pull_error = (
        'rpc error: code = NotFound desc = failed to pull and unpack image "registry.invalid/nope:1": '
        'failed to resolve reference "registry.invalid/nope:1": registry.invalid/nope:1: not found'
    )
    assert message == pull_error
    _, message = wait_until(reason_is("ImagePullBackOff"), 30, "the back-off")
    assert message == f'Back-off pulling image "registry.invalid/nope:1": ErrImagePull: {pull_error}'
    assert phase(api, "nopull") == "Pending"


def test_a_secret_volume_is_a_file_and_the_pod_waits_for_its_secret(api: Any, cluster: FakeCluster) -> None:
    spec = pod("reader", 'cat "$TOKEN_FILE"; ls "$(dirname "$TOKEN_FILE")"')
    spec["spec"]["volumes"] = [{"name": "tok", "secret": {"secretName": "reader-token"}}]
    container = spec["spec"]["containers"][0]
    container["volumeMounts"] = [{"name": "tok", "mountPath": "/var/run/tok", "readOnly": True}]
    container["env"] = [{"name": "TOKEN_FILE", "value": "/var/run/tok/token"}]
    created = api.create_namespaced_pod(NAMESPACE, spec)

    wait_until(lambda: waiting(api, "reader") == ("ContainerCreating", ""), 30, "the pod to be scheduled")
    assert phase(api, "reader") == "Pending"  # no Secret yet: the kubelet waits for the volume
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "reader", "uid": created.metadata.uid}
    secret = api.create_namespaced_secret(
        NAMESPACE, {"metadata": {"name": "reader-token", "ownerReferences": [owner]}, "stringData": {"token": "t0k"}}
    )
    assert secret.data == {"token": "dDBr"}  # stringData folded into data
    assert secret.metadata.owner_references[0].uid == created.metadata.uid

    wait_until(lambda: phase(api, "reader") == "Succeeded", 30, "the pod to succeed")
    assert api.read_namespaced_pod_log("reader", NAMESPACE) == "t0ktoken\n"

    api.delete_namespaced_pod("reader", NAMESPACE, grace_period_seconds=0)
    # The garbage collector takes what the Pod owned.
    wait_until(lambda: cluster.secret(NAMESPACE, "reader-token") is None, 30, "the owned secret to go")


def test_delete_sends_sigterm_then_sigkill_after_the_grace(api: Any, cluster: FakeCluster, tmp_path: Path) -> None:
    marker = tmp_path / "got-term"
    api.create_namespaced_pod(NAMESPACE, pod("stubborn", f"trap 'touch {marker}' TERM; while true; do sleep 0.1; done"))
    wait_until(lambda: phase(api, "stubborn") == "Running", 30, "the pod to run")

    deleted = api.delete_namespaced_pod("stubborn", NAMESPACE, grace_period_seconds=2)
    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.metadata.deletion_grace_period_seconds == 2
    wait_until(marker.exists, 30, "SIGTERM to reach the container")
    assert api.read_namespaced_pod("stubborn", NAMESPACE).metadata.deletion_timestamp is not None
    wait_until(lambda: cluster.pod(NAMESPACE, "stubborn") is None, 30, "SIGKILL after the grace, and the pod gone")
    assert ("pods", "stubborn", 2) in cluster.deleted


def test_a_missing_secret_key_ref_is_a_create_container_config_error(api: Any) -> None:
    spec = pod("config", "true")
    spec["spec"]["containers"][0]["env"] = [
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}
    ]
    api.create_namespaced_pod(NAMESPACE, spec)
    wait_until(lambda: waiting(api, "config") == ("CreateContainerConfigError", 'secret "absent" not found'), 30,
               "the config error")  # fmt: skip


def test_a_command_that_is_not_there_ends_the_pod_with_start_error(api: Any) -> None:
    spec = pod("nocmd", "true")
    spec["spec"]["containers"][0]["command"] = ["/nonexistent/python3"]
    api.create_namespaced_pod(NAMESPACE, spec)
    wait_until(lambda: phase(api, "nocmd") == "Failed", 30, "the pod to fail")
    [cstatus] = api.read_namespaced_pod("nocmd", NAMESPACE).status.container_statuses
    assert (cstatus.state.terminated.exit_code, cstatus.state.terminated.reason) == (128, "StartError")
