"""The Kubernetes launcher's options and the manifests it sends: the runner Pod and its token Secret.

Pure functions (no API calls), so what a Pod looks like is testable without a
cluster. ``pod_template`` (a YAML file: a Pod, a PodTemplate, or just
``{metadata, spec}``) lies *under* Gantry's own fields: :func:`merge_under`
lays Gantry's Pod over it, dicts key by key, lists of named things
(containers, volumes, env, ports; volume mounts by path) item by item, and
anything else Gantry sets replaces the template's. So the template adds
tolerations, affinity, volumes, sidecars, a security context, env for the
runner container; Gantry's labels, ``restartPolicy: Never``, the runner
container's image, command, args and env (the names Gantry sets), the token's
volumes and its hand-over init container always win.

The runner token's way in: the Secret is mounted only into a first init
container, ``runner-token``, which copies the file into a memory-backed
``emptyDir`` as the image's user, mode 0400, and exits; the runner container
mounts only that folder, reads the file and deletes it before any step runs
(as with the Docker launcher's copied-in file). A Secret volume cannot do this
by itself: its files belong to root, and the Pod's ``fsGroup`` makes them group
readable (0440) whatever ``defaultMode`` says, so every process of the
runner's user, the steps too, could read it for the Pod's whole life.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launchers.base import Assignment

LABEL_GROUP = "gantry.io/group-id"
LABEL_RUN = "gantry.io/run-id"
LABEL_RUNNER = "gantry.io/runner-id"
MANAGED_BY = "app.kubernetes.io/managed-by"
APP_NAME = "app.kubernetes.io/name"
CONTAINER = "runner"
TOKEN_VOLUME = "gantry-runner-token"
TOKEN_DIR = "/var/run/gantry/runner-token"
TOKEN_KEY = "token"
# The Secret's own volume, mounted only into the hand-over init container.
TOKEN_SECRET_VOLUME = "gantry-runner-token-secret"
TOKEN_SECRET_DIR = "/var/run/gantry/runner-token-secret"
TOKEN_INIT = "runner-token"
# The runner image's user and group (runners/Dockerfile): the Pod's fsGroup, so the
# hand-over (running as that user) may read the Secret's root-owned file.
RUNNER_GID = 10001
# Copies the Secret's file for the runner's user alone; O_EXCL: never onto a file already there.
# Python, since the runner image has it (the runner is Python) and a base image may lack install(1).
HANDOVER = (
    "import os, pathlib, sys; src, dst = sys.argv[1:]; data = pathlib.Path(src).read_bytes(); "
    "fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400); os.write(fd, data); os.close(fd)"
)
# Run from the image's working directory (Gantry's image: /app), where the `runners` package is.
COMMAND = ["python3", "-m", "runners.ephemeral"]
# Handed from the coordinator's environment to the runner, as the local launcher does.
PASSED_ENV = ("GANTRY_LOG_LEVEL", "GANTRY_STOP_GRACE")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# A Kubernetes quantity (100m, 0.5, 512Mi, 1G, 1e3): checked here so a typo stops the coordinator at start.
QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E|[eE][+-]?\d+)?$")
RESOURCES = {
    "cpu_request": ("requests", "cpu"),
    "cpu_limit": ("limits", "cpu"),
    "memory_request": ("requests", "memory"),
    "memory_limit": ("limits", "memory"),
}
OPTIONS = frozenset(
    {
        "image", "namespace", "service_account", *RESOURCES, "node_selector", "image_pull_policy",
        "active_deadline_seconds", "server_url", "startup_grace", "pod_template", "context",
    }
)  # fmt: skip


@dataclass(frozen=True)
class PodOptions:
    image: str
    namespace: str = ""
    service_account: str = ""
    # {"requests": {"cpu": "500m"}, "limits": {...}}
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    image_pull_policy: str = ""
    active_deadline_seconds: int | None = None
    server_url: str = ""
    startup_grace: float = 30.0
    # {"metadata": {...}, "spec": {...}} from the pod_template file.
    template: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def parse_options(options: Mapping[str, str], *, env: Mapping[str, str]) -> tuple[PodOptions, str]:
    """``--launcher-option`` pairs → (PodOptions, kubeconfig context); ValueError names what is wrong."""
    unknown = set(options) - OPTIONS
    if unknown:
        raise ValueError(
            f"unknown kubernetes launcher options: {', '.join(sorted(unknown))} (known: {', '.join(sorted(OPTIONS))})"
        )
    image = options.get("image", "").strip()
    if not image:
        raise ValueError("the kubernetes launcher needs --launcher-option image=IMAGE")
    resources: dict[str, dict[str, str]] = {}
    for key, (part, resource) in RESOURCES.items():
        value = options.get(key, "").strip()
        if value:
            if not QUANTITY.match(value):
                raise ValueError(f"kubernetes launcher option {key}={value!r} is not a Kubernetes quantity")
            resources.setdefault(part, {})[resource] = value
    policy = options.get("image_pull_policy", "")
    if policy and policy not in PULL_POLICIES:
        raise ValueError(f"image_pull_policy must be one of {', '.join(PULL_POLICIES)}, not {policy!r}")
    deadline = None
    if options.get("active_deadline_seconds"):
        deadline = _number(options, "active_deadline_seconds", int)
        if deadline < 1:
            raise ValueError("active_deadline_seconds must be at least 1")
    grace = 30.0
    if options.get("startup_grace"):
        grace = _number(options, "startup_grace", float)
        if grace < 0:
            raise ValueError("startup_grace must not be negative")
    parsed = PodOptions(
        image=image,
        namespace=options.get("namespace", "").strip(),
        service_account=options.get("service_account", "").strip(),
        resources=resources,
        node_selector=_pairs(options.get("node_selector", "")),
        image_pull_policy=policy,
        active_deadline_seconds=deadline,
        server_url=options.get("server_url", "").strip(),
        startup_grace=grace,
        template=load_template(options["pod_template"]) if options.get("pod_template") else {},
        env={name: env[name] for name in PASSED_ENV if env.get(name)},
    )
    return parsed, options.get("context", "").strip()


def _number(options: Mapping[str, str], key: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(options[key])
    except ValueError:
        raise ValueError(f"kubernetes launcher option {key}={options[key]!r} is not a number") from None


def _pairs(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` → {k: v, k2: v2}."""
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"node_selector takes key=value,key=value, not {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def load_template(path: str) -> dict[str, Any]:
    """The ``pod_template`` file → {"metadata": {labels, annotations}, "spec": {...}}."""
    try:
        document = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"pod_template {path}: {exc}") from exc
    if isinstance(document, dict) and isinstance(document.get("template"), dict):
        document = document["template"]  # a PodTemplate
    if not isinstance(document, dict) or not isinstance(document.get("spec"), dict):
        raise ValueError(f"pod_template {path}: expected a Pod (or PodTemplate) with a spec mapping")
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"pod_template {path}: metadata must be a mapping")
    # Only labels and annotations: the name, namespace, owners and the rest are Gantry's to set.
    kept = {k: dict(metadata[k]) for k in ("labels", "annotations") if isinstance(metadata.get(k), dict)}
    return {"metadata": kept, "spec": document["spec"]}


def pod_name(assignment: Assignment) -> str:
    # The runner id tells apart two claims of one run (a lapsed lease re-dispatched).
    return f"gantry-{assignment.run_id}-{assignment.runner_id[:8]}".lower()


def labels(assignment: Assignment) -> dict[str, str]:
    return {
        MANAGED_BY: "gantry",
        APP_NAME: "gantry-runner",
        LABEL_GROUP: assignment.group_id,
        LABEL_RUN: assignment.run_id,
        LABEL_RUNNER: assignment.runner_id,
    }


def pod_manifest(assignment: Assignment, options: PodOptions) -> dict[str, Any]:
    """The runner Pod: Gantry's fields laid over the template. Holds no secret."""
    name = pod_name(assignment)
    env = [
        {"name": "GANTRY_SERVER", "value": options.server_url or assignment.server},
        {"name": "GANTRY_RUN_ID", "value": assignment.run_id},
        {"name": "GANTRY_RUNNER_ID", "value": assignment.runner_id},
        {"name": "GANTRY_RUNNER_TOKEN_FILE", "value": f"{TOKEN_DIR}/{TOKEN_KEY}"},
        {"name": "GANTRY_LAUNCHER", "value": "kubernetes"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *({"name": k, "value": v} for k, v in sorted(options.env.items())),
    ]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": options.image,
        "command": list(COMMAND),
        "args": [],
        "env": env,
        # Writable: the runner deletes the token's file once read.
        "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": False}],
    }
    handover: dict[str, Any] = {
        "name": TOKEN_INIT,
        "image": options.image,
        "command": ["python3", "-c", HANDOVER, f"{TOKEN_SECRET_DIR}/{TOKEN_KEY}", f"{TOKEN_DIR}/{TOKEN_KEY}"],
        "volumeMounts": [
            {"name": TOKEN_SECRET_VOLUME, "mountPath": TOKEN_SECRET_DIR, "readOnly": True},
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if options.image_pull_policy:
        container["imagePullPolicy"] = handover["imagePullPolicy"] = options.image_pull_policy
    if options.resources:
        container["resources"] = {part: dict(values) for part, values in options.resources.items()}
        # The same for the hand-over: a quota that wants limits on every container accepts the Pod, and
        # the Pod's request stays the runner's (an init container counts only while it runs, before it).
        handover["resources"] = {part: dict(values) for part, values in options.resources.items()}
    template_spec = options.template.get("spec") or {}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # First, before any init container of the template's.
        "initContainers": [handover],
        "containers": [container],
        "volumes": [
            # 0400, root's; with the fsGroup below the kubelet makes it 0440 root:10001.
            {"name": TOKEN_SECRET_VOLUME, "secret": {"secretName": f"{name}-token", "defaultMode": 0o400}},
            # In memory: the token never reaches the node's disk.
            {"name": TOKEN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    }
    if "fsGroup" not in (template_spec.get("securityContext") or {}):
        # The template may name another group its image's user is in.
        spec["securityContext"] = {"fsGroup": RUNNER_GID}
    if options.service_account:
        spec["serviceAccountName"] = options.service_account
    elif not {"serviceAccountName", "automountServiceAccountToken"} & set(template_spec):
        # The runner needs no Kubernetes credentials, and its steps run the deployment's code:
        # give them none unless the operator asks for a service account.
        spec["automountServiceAccountToken"] = False
    if options.node_selector:
        spec["nodeSelector"] = dict(options.node_selector)
    if options.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = options.active_deadline_seconds
    ours = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": labels(assignment),
            "annotations": {"kubectl.kubernetes.io/default-container": CONTAINER},
        },
        "spec": spec,
    }
    merged: dict[str, Any] = merge_under(options.template, ours)
    return merged


def secret_manifest(assignment: Assignment, options: PodOptions, *, pod_uid: str) -> dict[str, Any]:
    """The runner token's Secret, owned by its Pod: deleting the Pod deletes it."""
    name = pod_name(assignment)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{name}-token",
            "namespace": options.namespace,
            "labels": labels(assignment),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod_uid}],
        },
        "type": "Opaque",
        "immutable": True,
        "data": {TOKEN_KEY: base64.b64encode(assignment.runner_token.encode()).decode()},
    }


def _key(list_name: str, item: Any) -> Any:
    if not isinstance(item, dict):
        return None
    return item.get("mountPath") if list_name == "volumeMounts" else item.get("name")


def merge_under(template: Any, ours: Any, list_name: str = "") -> Any:
    """``ours`` laid over ``template``: ours wins wherever both say something."""
    if isinstance(template, dict) and isinstance(ours, dict):
        merged = dict(template)
        for key, value in ours.items():
            merged[key] = merge_under(template[key], value, key) if key in template else value
        return merged
    if isinstance(template, list) and isinstance(ours, list):
        keys = [_key(list_name, item) for item in ours + template]
        if ours and template and None not in keys:
            # Named items merge one by one: ours first (the runner container leads), then the template's others.
            theirs = {_key(list_name, item): item for item in template}
            merged_items = [merge_under(theirs.get(_key(list_name, item)), item, list_name) for item in ours]
            mine = {_key(list_name, item) for item in ours}
            return merged_items + [item for item in template if _key(list_name, item) not in mine]
    return ours
