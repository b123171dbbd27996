"""deploy/kubernetes/: the example overlay, as ``kubectl kustomize`` renders it, against Kubernetes' own schemas.

``kubectl kustomize deploy/kubernetes/overlays/example`` runs as a subprocess
(under ``CI=true`` a missing kubectl fails the tests instead of skipping
them). ``kubernetes-validate`` ships the API's JSON schemas inside the
package, so the validation runs offline; strict mode refuses fields the schema
does not know (a typo like ``serviceAcountName``). Beyond the schema, what
the objects must say to each other and to Gantry: every part is there; the
coordinator's server URL is the web Service's name and port; the probes, the
grace periods, the replica rules; the secrets only in the Secret, every
reference resolving; the runner Pods on the runner image; and the launcher
doing a whole run's work under exactly the Role's rules, using every one.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gunicorn.config
import kubernetes_validate
import pytest
import yaml

import launchers
from launchers.base import Assignment
from launchers.kubernetes import KubernetesLauncher
from launchers.kubernetes_pod import parse_options, pod_manifest, secret_manifest
from tests.e2e.conftest import wait_until
from tests.k8s.fake_apiserver import FakeCluster
from tests.k8s.fixtures import SLOW_IMAGE

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "example"
# The oldest Kubernetes the manifests are meant for, and the newest the validator knows.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
# The processes that run Gantry's server code (and so need the schema and its settings).
SERVER_DEPLOYMENTS = ("gantry-web", "gantry-worker", "gantry-beat", "gantry-dispatcher")
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@cache
def _render() -> tuple[list[dict[str, Any]], str]:
    """The overlay's objects, or why they could not be rendered."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return [], "kubectl is not installed (Debian: kubernetes-client; .ci/apt-ensure installs it)"
    done = subprocess.run([kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return [], f"kubectl kustomize failed: {done.stderr.strip()}"
    return [d for d in yaml.safe_load_all(done.stdout) if d], ""


def rendered() -> list[dict[str, Any]]:
    docs, problem = _render()
    if problem.startswith("kubectl is not installed"):
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI needs kubectl for this test: {problem}", pytrace=False)
        pytest.skip(f"needs kubectl: {problem}")
    if problem:
        pytest.fail(problem, pytrace=False)
    return docs


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in rendered() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} rendered"
    return found[0]


def generated(kind: str, base_name: str) -> dict[str, Any]:
    """A ConfigMap or Secret from a generator: its name carries a content hash."""
    [doc] = [
        d for d in rendered() if d["kind"] == kind and re.fullmatch(f"{base_name}(-[a-z0-9]+)?", d["metadata"]["name"])
    ]
    return doc


def pod_spec(name: str, kind: str = "Deployment") -> dict[str, Any]:
    spec: dict[str, Any] = one(kind, name)["spec"]["template"]["spec"]
    return spec


def container(name: str) -> dict[str, Any]:
    [first, *_] = pod_spec(name)["containers"]
    return first


def config() -> dict[str, str]:
    data: dict[str, str] = generated("ConfigMap", "gantry-config")["data"]
    return data


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet builds it from the rendered ConfigMap and Secrets."""
    env: dict[str, str] = {}
    for source in spec.get("envFrom") or []:
        env.update(_config_map(source["configMapRef"]["name"])["data"])
    for item in spec.get("env") or []:
        ref = item.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            env[item["name"]] = _config_map(ref["configMapKeyRef"]["name"])["data"][ref["configMapKeyRef"]["key"]]
        elif "secretKeyRef" in ref:
            env[item["name"]] = f"<secret {ref['secretKeyRef']['name']}/{ref['secretKeyRef']['key']}>"
        else:
            env[item["name"]] = VAR.sub(lambda m: env.get(m[1], m[0]), item["value"])
    return env


def _config_map(name: str) -> dict[str, Any]:
    return one("ConfigMap", name)


def every_container() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(owner, pod spec, container) for every container and init container of every workload."""
    found = []
    for doc in rendered():
        if doc["kind"] in ("Deployment", "Job"):
            spec = doc["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                found.append((f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}", spec, c))
    return found


# ---------------------------------------------------------------- the schema, and what is there


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(version: str) -> None:
    for doc in rendered():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_the_validator_catches_a_typo() -> None:
    deployment = copy.deepcopy(one("Deployment", "gantry-web"))
    deployment["spec"]["template"]["spec"]["serviceAcountName"] = "typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def test_the_overlay_renders_gantry_whole() -> None:
    def name(doc: dict[str, Any]) -> str:
        # A generated ConfigMap's or Secret's name ends with its content's hash.
        generated = doc["kind"] in ("ConfigMap", "Secret")
        return re.sub(r"-[a-z0-9]{10}$", "", doc["metadata"]["name"]) if generated else doc["metadata"]["name"]

    names = {(d["kind"], name(d)) for d in rendered()}
    assert names == {
        ("Namespace", "gantry"), ("Namespace", "gantry-runners"),
        ("ConfigMap", "gantry-config"), ("Secret", "gantry-secrets"), ("Secret", "gantry-group-token"),
        ("Job", "gantry-migrate"),
        ("Deployment", "gantry-web"), ("Service", "gantry-web"), ("PodDisruptionBudget", "gantry-web"),
        ("Deployment", "gantry-worker"), ("Deployment", "gantry-beat"), ("Deployment", "gantry-dispatcher"),
        ("Deployment", "gantry-coordinator"), ("ServiceAccount", "gantry-coordinator"),
        ("Role", "gantry-coordinator"), ("RoleBinding", "gantry-coordinator"),
    }  # fmt: skip
    # Everything but the runner RBAC lives in Gantry's namespace.
    for doc in rendered():
        if doc["kind"] not in ("Namespace", "Role", "RoleBinding"):
            assert doc["metadata"]["namespace"] == "gantry", f"{doc['kind']}/{doc['metadata']['name']}"


# ---------------------------------------------------------------- the web server


def test_the_web_service_is_what_the_coordinator_calls() -> None:
    service, web = one("Service", "gantry-web"), one("Deployment", "gantry-web")
    [port] = service["spec"]["ports"]
    coordinator = one("Deployment", "gantry-coordinator")
    server = urlsplit(env_of(container("gantry-coordinator"))["GANTRY_SERVER"])
    # The coordinator is in the Service's namespace: its bare name resolves.
    assert coordinator["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert (server.scheme, server.hostname, server.port) == ("http", service["metadata"]["name"], port["port"])
    # The runner Pods are in another namespace: their URL names the Service's too.
    runners = urlsplit(parse_options(coordinator_options(), env={})[0].server_url)
    [name, namespace, *_] = (runners.hostname or "").split(".")
    assert (runners.scheme, name, namespace, runners.port) == (
        "http", service["metadata"]["name"], service["metadata"]["namespace"], port["port"],
    )  # fmt: skip
    allowed = config()["GANTRY_ALLOWED_HOSTS"].split(",")
    assert server.hostname in allowed
    assert runners.hostname in allowed
    # ... and the Service reaches the web Pods' port.
    labels = web["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert port["targetPort"] in [p["name"] for p in container("gantry-web")["ports"]]


def test_the_web_runs_two_replicas_probed_and_kept_up_by_its_budget() -> None:
    web, budget = one("Deployment", "gantry-web"), one("PodDisruptionBudget", "gantry-web")
    assert web["spec"]["replicas"] == 2
    assert web["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spec = container("gantry-web")
    assert spec["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["livenessProbe"]["httpGet"]["path"] == "/healthz"
    allowed = config()["GANTRY_ALLOWED_HOSTS"].split(",")
    for probe in (spec["readinessProbe"], spec["livenessProbe"]):
        assert probe["httpGet"]["port"] == "http"
        # Django refuses the Pod IP the kubelet would send as Host.
        [host] = [h["value"] for h in probe["httpGet"]["httpHeaders"] if h["name"] == "Host"]
        assert host in allowed
    labels = web["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Spread over nodes, so that one node's loss leaves a replica.
    [spread] = web["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    assert 1 <= budget["spec"]["minAvailable"] < web["spec"]["replicas"]


def test_the_web_stops_within_its_grace_answering_parked_polls() -> None:
    """The grace covers the preStop pause and gunicorn's graceful timeout (parked polls answer at SIGTERM)."""
    pod, spec = pod_spec("gantry-web"), container("gantry-web")
    # The image's command (the Dockerfile's CMD) unless the manifest gives one.
    [cmd] = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    argv = spec.get("command") or json.loads(cmd.removeprefix("CMD "))
    assert argv[:2] == ["gunicorn", "gantry.asgi"]  # the ASGI mode: SIGTERM answers parked polls at once
    argv += shlex.split(env_of(spec).get("GUNICORN_CMD_ARGS", ""))
    graceful = gunicorn.config.GracefulTimeout.default
    if "--graceful-timeout" in argv:
        graceful = int(argv[argv.index("--graceful-timeout") + 1])
    pre_stop = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + graceful


def test_every_server_process_waits_for_the_migrate_job_before_it_starts() -> None:
    job = one("Job", "gantry-migrate")
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert migrate["image"] == container("gantry-web")["image"]
    for name in SERVER_DEPLOYMENTS:
        [wait] = pod_spec(name)["initContainers"]
        assert "python manage.py migrate --check" in " ".join(wait["command"]), name
        assert wait["image"] == container(name)["image"], name
        # The same database as the process it holds back.
        main = env_of(container(name))
        assert {k: main[k] for k in ("DATABASE_URL", "REDIS_URL")}.items() <= env_of(wait).items(), name


def test_beat_is_one_replica_recreated_and_the_others_may_scale() -> None:
    beat = one("Deployment", "gantry-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert container("gantry-beat")["command"][:4] == ["celery", "-A", "gantry", "beat"]
    assert container("gantry-worker")["command"][:4] == ["celery", "-A", "gantry", "worker"]
    assert container("gantry-dispatcher")["command"] == ["python", "manage.py", "dispatcher"]
    assert one("Deployment", "gantry-worker")["spec"]["replicas"] == 2  # the overlay's `replicas:`


# ---------------------------------------------------------------- settings and secrets


def test_secrets_come_from_the_secret_and_every_reference_resolves() -> None:
    secrets = {d["metadata"]["name"]: d for d in rendered() if d["kind"] == "Secret"}
    for owner, _, spec in every_container():
        for source in spec.get("envFrom") or []:
            assert set(source) == {"configMapRef"}, owner
            one("ConfigMap", source["configMapRef"]["name"])
        for item in spec.get("env") or []:
            ref = item.get("valueFrom", {})
            if item["name"] in ("DATABASE_URL", "REDIS_URL", "GANTRY_SECRET_KEY", "GANTRY_SECRETS_KEYS",
                                "GANTRY_METRICS_TOKEN", "AWS_SECRET_ACCESS_KEY"):  # fmt: skip
                assert "secretKeyRef" in ref, f"{owner}: {item['name']} must come from a Secret"
            if "secretKeyRef" in ref:
                secret = secrets[ref["secretKeyRef"]["name"]]
                keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))
                assert ref["secretKeyRef"]["key"] in keys, f"{owner}: {item['name']}"
            if "configMapKeyRef" in ref:
                assert ref["configMapKeyRef"]["key"] in _config_map(ref["configMapKeyRef"]["name"])["data"], owner
    # Nothing that holds a password in the ConfigMap.
    assert not {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "GANTRY_SECRET_KEY"} & set(config())
    # The agreed key: Secret `metrics-token` feeds GANTRY_METRICS_TOKEN to the web Pods.
    token = [e for e in container("gantry-web")["env"] if e["name"] == "GANTRY_METRICS_TOKEN"]
    assert [e["valueFrom"]["secretKeyRef"]["key"] for e in token] == ["metrics-token"]
    assert token[0]["valueFrom"]["secretKeyRef"]["name"] == generated("Secret", "gantry-secrets")["metadata"]["name"]


def test_the_config_maps_settings_are_documented_and_start_gantry() -> None:
    documented = (ROOT / "docs" / "configuration.md").read_text()
    settings = {k: v for k, v in config().items() if k != "GANTRY_RUNNER_IMAGE"}  # the coordinator's, below
    for name in settings:
        assert f"`{name}`" in documented, f"{name} is not in docs/configuration.md"
    # Gantry's own readers accept every value (a bad one stops the process at start).
    probe = "from gantry import conf; d = conf.django(); conf.get(); conf.server(); print(','.join(d.allowed_hosts))"
    env = {"PATH": os.environ.get("PATH", ""), "DJANGO_SETTINGS_MODULE": "gantry.settings", **settings}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == settings["GANTRY_ALLOWED_HOSTS"]


def test_every_container_is_unprivileged_and_sized() -> None:
    for owner, pod, spec in every_container():
        security = spec["securityContext"]
        assert (security.get("runAsNonRoot") or pod["securityContext"].get("runAsNonRoot")) is True, owner
        # runAsNonRoot needs a numeric user: Gantry's image names its user.
        assert (security.get("runAsUser") or pod["securityContext"].get("runAsUser", 0)) > 0, owner
        assert security["allowPrivilegeEscalation"] is False, owner
        assert security["readOnlyRootFilesystem"] is True, owner
        assert security["capabilities"] == {"drop": ["ALL"]}, owner
        assert spec["resources"]["requests"], owner
        assert spec["resources"]["limits"]["memory"], owner
        # The writable places the processes need (gunicorn's heartbeat files, beat's schedule).
        mounts = {m["mountPath"] for m in spec["volumeMounts"]}
        assert "/tmp" in mounts, owner


# ---------------------------------------------------------------- the coordinator


def coordinator_options() -> dict[str, str]:
    spec = container("gantry-coordinator")
    env = env_of(spec)
    args = [VAR.sub(lambda m: env[m[1]], a) for a in spec["args"]]  # as the kubelet expands them
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--launcher-option")


def test_the_coordinator_is_one_replica_recreated_with_the_launchers_options() -> None:
    deployment = one("Deployment", "gantry-coordinator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one("ServiceAccount", "gantry-coordinator")["metadata"]["name"]
    [spec] = pod["containers"]
    assert spec["command"] == ["python", "-m", "runners.coordinator"]
    args = spec["args"]
    assert args[args.index("--launcher") + 1] == "kubernetes"
    parsed, _ = parse_options(coordinator_options(), env={})
    assert parsed.namespace == one("Role", "gantry-coordinator")["metadata"]["namespace"]
    env = env_of(spec)
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    secret = generated("Secret", "gantry-group-token")
    [token_volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]]
    assert env["GANTRY_GROUP_TOKEN_FILE"] == f"{mounts[token_volume['name']]}/token"
    assert "token" in secret["data"]
    # Nothing secret on the command line (`ps` shows it).
    assert "--token" not in shlex.join(args)


def test_the_runner_pods_use_the_runner_image_not_the_servers() -> None:
    parsed, _ = parse_options(coordinator_options(), env={})
    # The overlay's `images:` entry for gantry-runner reached the launcher option.
    assert parsed.image == "registry.example.com/gantry-runner:1.0.0"
    assert parsed.image != container("gantry-coordinator")["image"]
    assert {container(name)["image"] for name in SERVER_DEPLOYMENTS} == {"registry.example.com/gantry:1.0.0"}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_runner_pod_and_secret_it_would_create_are_valid_too(version: str) -> None:
    parsed, _ = parse_options(coordinator_options(), env={})
    job = Assignment("http://gantry-web.gantry.svc.cluster.local:8000", "00000001-0000-4000-8000-000000000000",
                     "00000001-1111-4111-8111-111111111111", "tok", group_id="3")  # fmt: skip
    pod = pod_manifest(job, parsed)
    assert pod["spec"]["initContainers"][0]["image"] == parsed.image
    for doc in (pod, secret_manifest(job, parsed, pod_uid="00000000-0000-4000-8000-000000000001")):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_coordinator_serves_its_health_on_8081_and_is_probed_there() -> None:
    spec = container("gantry-coordinator")
    args = spec["args"]
    assert args[args.index("--health-addr") + 1] == "0.0.0.0:8081"
    assert {"name": "health", "containerPort": 8081} in spec["ports"]
    for probe in (spec["readinessProbe"], spec["livenessProbe"]):
        assert probe["httpGet"]["path"] == "/healthz"
        assert probe["httpGet"]["port"] in ("health", 8081)


def test_the_role_binds_the_coordinators_service_account_in_the_runner_namespace() -> None:
    role, binding = one("Role", "gantry-coordinator"), one("RoleBinding", "gantry-coordinator")
    account = one("ServiceAccount", "gantry-coordinator")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    # No Secret of Gantry's (the group token, the database's password) is where the Role opens.
    for doc in rendered():
        if doc["kind"] == "Secret":
            assert doc["metadata"]["namespace"] != role["metadata"]["namespace"]


def role_rules() -> set[tuple[str, str]]:
    rules = set()
    for rule in one("Role", "gantry-coordinator")["rules"]:
        assert rule["apiGroups"] == [""]
        rules |= {(verb, resource) for resource in rule["resources"] for verb in rule["verbs"]}
    return rules


def test_the_launcher_works_under_the_role_and_uses_all_of_it(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = one("Role", "gantry-coordinator")["metadata"]["namespace"]
    cluster.namespaces.add(namespace)
    monkeypatch.setenv("KUBECONFIG", str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
    cluster.allowed = role_rules()
    cluster.gc = False  # so that reap's own Secret delete is what removes it
    # The rendered options, but an image the fake node has (one whose Pods stay Pending).
    options = coordinator_options() | {"image": SLOW_IMAGE}

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
