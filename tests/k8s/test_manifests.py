"""deploy/kubernetes/: valid against Kubernetes' own schemas, and consistent with the launcher.

``kubernetes-validate`` ships the API's JSON schemas inside the package, so
this runs offline; strict mode refuses fields the schema does not know (a
typo like ``serviceAcountName``). Beyond the schema: the Deployment runs one
replica with ``Recreate``, its coordinator's launcher options parse, and the
launcher does a whole run's work under exactly the Role's rules, using every
one of them.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import launchers
from launchers.base import Assignment
from launchers.kubernetes import KubernetesLauncher
from launchers.kubernetes_pod import parse_options
from tests.e2e.conftest import wait_until
from tests.k8s.fake_apiserver import FakeCluster
from tests.k8s.fixtures import SLOW_IMAGE

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests are meant for, and the newest the validator knows.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((path.name, doc))
    return found


def one(kind: str) -> dict[str, Any]:
    [doc] = [d for _, d in documents() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schema(version: str) -> None:
    docs = documents()
    assert sorted({d["kind"] for _, d in docs}) == [
        "Deployment", "Namespace", "Role", "RoleBinding", "Secret", "ServiceAccount",
    ]  # fmt: skip
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_the_validator_catches_a_typo() -> None:
    deployment = one("Deployment")
    deployment["spec"]["template"]["spec"]["serviceAcountName"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_the_coordinator_is_one_replica_recreated_with_the_launchers_options() -> None:
    deployment = one("Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    [container] = pod["containers"]
    assert container["command"] == ["python", "-m", "runners.coordinator"]
    args = container["args"]
    assert args[:2] == ["--launcher", "kubernetes"]
    options = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--launcher-option")
    parsed, _ = parse_options(options, env={})
    assert parsed.namespace == one("Role")["metadata"]["namespace"]
    assert parsed.image == container["image"]  # the runner Pods run Gantry's image too
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secret = one("Secret")
    [token_volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]]
    assert env["GANTRY_GROUP_TOKEN_FILE"] == f"{mounts[token_volume['name']]}/token"
    assert "token" in secret["stringData"]
    # Nothing secret on the command line (`ps` shows it).
    assert "--token" not in shlex.join(args)


def test_the_role_binds_the_coordinators_service_account_in_the_runner_namespace() -> None:
    role, binding, account = one("Role"), one("RoleBinding"), one("ServiceAccount")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    # The group token's namespace is not the one the Role opens.
    assert one("Secret")["metadata"]["namespace"] != role["metadata"]["namespace"]


def role_rules() -> set[tuple[str, str]]:
    rules = set()
    for rule in one("Role")["rules"]:
        assert rule["apiGroups"] == [""]
        rules |= {(verb, resource) for resource in rule["resources"] for verb in rule["verbs"]}
    return rules


def test_the_launcher_works_under_the_role_and_uses_all_of_it(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = one("Role")["metadata"]["namespace"]
    cluster.namespaces.add(namespace)
    monkeypatch.setenv("KUBECONFIG", str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
    cluster.allowed = role_rules()
    cluster.gc = False  # so that reap's own Secret delete is what removes it
    options = {"image": SLOW_IMAGE, "namespace": namespace}

    first = launchers.create("kubernetes", state_dir=tmp_path, options=options)
    restarted = launchers.create("kubernetes", state_dir=tmp_path, options=options)
    assert isinstance(first, KubernetesLauncher)
    assert isinstance(restarted, KubernetesLauncher)
    try:
        first.group_id = restarted.group_id = "3"
        job = Assignment("http://127.0.0.1:9", "00000001-0000-4000-8000-000000000000",
                         "00000001-1111-4111-8111-111111111111", "tok", group_id="3")  # fmt: skip
        first.launch(job)
        [handle] = restarted.discover()
        assert restarted.is_alive(handle)
        wait_until(lambda: (cluster.pod(namespace, handle.ident) or {}).get("status", {}).get("containerStatuses"),
                   30, "the pod to be scheduled")  # fmt: skip
        restarted.last_lines(handle)
        restarted.terminate(handle)
        assert restarted.reap(handle) is None
    finally:
        first.close()
        restarted.close()
    assert cluster.pods == {}
    assert cluster.secrets == {}
    assert cluster.used == cluster.allowed, (
        f"the Role grants more than the launcher uses: {cluster.allowed - cluster.used}"
    )
