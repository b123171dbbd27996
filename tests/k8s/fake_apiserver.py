"""A local fake of the Kubernetes API server: the core/v1 subset the Kubernetes launcher uses.

No API server can be installed on these machines, so the launcher's tests run
the official ``kubernetes`` client against this one: a threaded
``http.server`` on 127.0.0.1 (a port the OS picks) that speaks the API's wire
format closely enough that the client's own models deserialize every answer
(client-side validation stays on): objects carry ``apiVersion``/``kind``,
``metadata.uid``/``resourceVersion``/``creationTimestamp``, Pods a status with
conditions and container states, and errors are ``Status`` objects with the
API's reasons and messages.

What it serves (``/api/v1/namespaces/{ns}/...``):

- ``pods``: create (``dryRun=All`` too), get, list (``labelSelector``: ``=``,
  ``==``, ``!=``, ``in``, ``notin``, exists, ``!key``), delete
  (``gracePeriodSeconds``, in the query or a DeleteOptions body);
  ``pods/{name}/log`` (``container``, ``tailLines``, ``limitBytes``);
- ``secrets``: create (``data`` or ``stringData``), get, list, delete.

Pods come alive through :class:`tests.k8s.fake_kubelet.FakeKubelet`: it runs a
Pod's containers as local processes. The garbage collector is the kubelet's
sweep too: a Secret whose owners (``ownerReferences``) are all gone is
deleted, as the real one does (``gc=False`` turns it off, as a cluster whose
collector lags). Requests need the bearer token of the kubeconfig that
:meth:`FakeCluster.write_kubeconfig` writes; tests can forbid a verb on a
resource (403 as RBAC words it), make the next requests fail (500, 429, ...),
and read what was created and deleted.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import itertools
import json
import re
import secrets
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from tests.k8s.fake_kubelet import FakeImage, FakeKubelet
from tests.k8s.selectors import parse_selector

PATH = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<resource>pods|secrets)(?:/(?P<name>[^/]+)(?:/(?P<sub>log))?)?$"
)
# A DNS-1123 subdomain: what Pod and Secret names must be.
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E|[eE][+-]?\d+)?$")
KINDS = {"pods": "Pod", "secrets": "Secret"}
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """The API's error object (``kind: Status``), as every 4xx/5xx carries it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, reason, message, **details)


@dataclass
class Injected:
    verb: str
    resource: str
    code: int
    times: int
    retry_after: int | None = None


@dataclass
class FakeCluster:
    """The API server's state, its HTTP front and its kubelet. Use as a context manager."""

    tmp: Path
    images: dict[str, FakeImage] = field(default_factory=dict)
    namespaces: set[str] = field(default_factory=lambda: {"default"})
    gc: bool = True
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    lock: threading.RLock = field(default_factory=threading.RLock)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    secrets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Every Pod and Secret as it was created (deep copies) and every delete, for the tests.
    created: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[tuple[str, str, int | None]] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    forbidden: set[tuple[str, str]] = field(default_factory=set)
    # RBAC: when set, only these (verb, resource) pairs are allowed (a Role's rules); `used` records
    # every pair a request was admitted for.
    allowed: set[tuple[str, str]] | None = None
    used: set[tuple[str, str]] = field(default_factory=set)
    injected: list[Injected] = field(default_factory=list)
    _versions: Iterator[int] = field(default_factory=lambda: itertools.count(1000))

    def __post_init__(self) -> None:
        self.kubelet = FakeKubelet(self)
        self._http: ThreadingHTTPServer | None = None
        self.stopped = False

    # ------------------------------------------------------------ life

    def __enter__(self) -> FakeCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"cluster": self})
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, name="fake-apiserver", daemon=True).start()
        self.kubelet.start()

    def stop(self) -> None:
        self.stopped = True
        self.kubelet.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    @property
    def url(self) -> str:
        assert self._http is not None
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def write_kubeconfig(
        self, path: Path, *, namespace: str | None = None, token: str | None = None, server: str | None = None
    ) -> Path:
        context: dict[str, str] = {"cluster": "fake", "user": "fake"}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": server or self.url}}],
            "users": [{"name": "fake", "user": {"token": token or self.token}}],
            "contexts": [{"name": "fake", "context": context}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # ------------------------------------------------------------ for tests

    def forbid(self, verb: str, resource: str) -> None:
        self.forbidden.add((verb, resource))

    def fail_next(self, verb: str, resource: str, code: int, *, times: int = 1, retry_after: int | None = None) -> None:
        self.injected.append(Injected(verb, resource, code, times, retry_after))

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.pods.get((namespace, name))
            return copy.deepcopy(found) if found else None

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.secrets.get((namespace, name))
            return copy.deepcopy(found) if found else None

    def created_pods(self, **labels: str) -> list[dict[str, Any]]:
        return [
            o
            for o in self.created
            if o["kind"] == "Pod" and all(o["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())
        ]

    def next_version(self) -> str:
        return str(next(self._versions))

    # ------------------------------------------------------------ the API

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        match = PATH.match(path)
        if not match:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns, resource, name, sub = match["ns"], match["resource"], match["name"], match["sub"]
        verb = {"GET": "get" if name else "list", "POST": "create", "DELETE": "delete"}.get(method)
        if verb is None or (verb == "create" and name) or (sub and method != "GET"):
            raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on {resource}")
        rbac_resource = f"{resource}/{sub}" if sub else resource
        self._admit(verb, rbac_resource, ns)
        with self.lock:
            if ns not in self.namespaces:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', name=ns, kind="namespaces")
            if sub == "log":
                return 200, self.kubelet.log(ns, str(name), query)
            if verb == "create":
                return 201, self._create(resource, ns, body, dry_run=query.get("dryRun") == "All")
            if verb == "list":
                return 200, self._list(resource, ns, query.get("labelSelector", ""))
            obj = self._store(resource).get((ns, str(name)))
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource)
            if verb == "get":
                return 200, copy.deepcopy(obj)
            grace = query.get("gracePeriodSeconds")
            if grace is None and isinstance(body, dict):
                grace = body.get("gracePeriodSeconds")
            return 200, self._delete(resource, ns, str(name), None if grace is None else int(grace))

    def _admit(self, verb: str, resource: str, ns: str) -> None:
        if (verb, resource) in self.forbidden or (self.allowed is not None and (verb, resource) not in self.allowed):
            raise ApiError(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "system:serviceaccount:gantry:gantry-coordinator" cannot {verb} '
                f'resource "{resource}" in API group "" in the namespace "{ns}"',
                kind=resource,
            )
        with self.lock:
            self.used.add((verb, resource))
            for injected in self.injected:
                if injected.times > 0 and (injected.verb, injected.resource) == (verb, resource):
                    injected.times -= 1
                    reason = {429: "TooManyRequests", 503: "ServiceUnavailable"}.get(injected.code, "InternalError")
                    error = ApiError(injected.code, reason, f"injected failure {injected.code} on {verb} {resource}")
                    if injected.retry_after is not None:
                        error.body["details"]["retryAfterSeconds"] = injected.retry_after
                    raise error

    def _store(self, resource: str) -> dict[tuple[str, str], dict[str, Any]]:
        return self.pods if resource == "pods" else self.secrets

    def _list(self, resource: str, ns: str, selector: str) -> dict[str, Any]:
        try:
            matches = parse_selector(selector)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {exc}") from None
        items = []
        for (item_ns, _), obj in sorted(self._store(resource).items()):
            if item_ns == ns and matches(obj["metadata"].get("labels") or {}):
                # List items carry no apiVersion/kind: the list does.
                items.append({k: v for k, v in copy.deepcopy(obj).items() if k not in ("apiVersion", "kind")})
        return {
            "apiVersion": "v1",
            "kind": f"{KINDS[resource]}List",
            "metadata": {"resourceVersion": self.next_version()},
            "items": items,
        }

    def _create(self, resource: str, ns: str, body: Any, *, dry_run: bool) -> dict[str, Any]:
        kind = KINDS[resource]
        if not isinstance(body, dict) or body.get("kind", kind) != kind or body.get("apiVersion", "v1") != "v1":
            raise ApiError(400, "BadRequest", f"the body of the request was not a v1 {kind}")
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = "v1", kind
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace", ns) != ns:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = str(meta.get("name") or "")
        causes = _validate_meta(meta)
        causes += _validate_pod(obj) if kind == "Pod" else _normalise_secret(obj)
        if causes:
            _field_name, _message = causes[0]
            raise ApiError(
                422,
                "Invalid",
                f'{kind} "{name}" is invalid: ' + ", ".join(f"{f}: {m}" for f, m in causes),
                name=name,
                kind=resource,
                causes=[{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
            )
        if (ns, name) in self._store(resource):
            raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists', name=name, kind=resource)
        meta.update(
            namespace=ns, uid=str(uuid.uuid4()), resourceVersion=self.next_version(), creationTimestamp=now_iso()
        )
        if kind == "Pod":
            self.kubelet.admit(obj)
        if dry_run:
            return obj
        self._store(resource)[(ns, name)] = obj
        self.created.append(copy.deepcopy(obj))
        return copy.deepcopy(obj)

    def _delete(self, resource: str, ns: str, name: str, grace: int | None) -> dict[str, Any]:
        self.deleted.append((resource, name, grace))
        if resource == "secrets":
            obj = self.secrets.pop((ns, name))
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "kind": resource, "uid": obj["metadata"]["uid"]},
            }
        return self.kubelet.delete(ns, name, grace)

    def remove_pod(self, ns: str, name: str) -> None:
        """The Pod object goes (its containers are gone); the collector then takes what it owned."""
        self.pods.pop((ns, name), None)
        self.collect_garbage()

    def collect_garbage(self) -> None:
        if not self.gc:
            return
        live = {pod["metadata"]["uid"] for pod in self.pods.values()}
        for key, obj in list(self.secrets.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if owners and not any(o.get("uid") in live for o in owners):
                del self.secrets[key]


def _validate_meta(meta: dict[str, Any]) -> list[tuple[str, str]]:
    causes = []
    name = str(meta.get("name") or "")
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif len(name) > 253 or not NAME.match(name):
        causes.append(("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of '
                       "lower case alphanumeric characters, '-' or '.'"))  # fmt: skip
    for key, value in (meta.get("labels") or {}).items():
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            causes.append((f"metadata.labels: {key}", f'Invalid value: "{value}": a valid label must be an empty '
                           "string or consist of alphanumeric characters, '-', '_' or '.'"))  # fmt: skip
    for i, owner in enumerate(meta.get("ownerReferences") or []):
        for required in ("apiVersion", "kind", "name", "uid"):
            if not owner.get(required):
                causes.append((f"metadata.ownerReferences[{i}].{required}", "Required value"))
    return causes


def _validate_pod(pod: dict[str, Any]) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("spec.containers", "Required value"))
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    seen: set[str] = set()
    # Names are unique across init containers and containers alike.
    every = [(f"spec.initContainers[{i}]", c) for i, c in enumerate(spec.get("initContainers") or [])]
    every += [(f"spec.containers[{i}]", c) for i, c in enumerate(containers)]
    for where, container in every:
        cname = container.get("name")
        if not cname:
            causes.append((f"{where}.name", "Required value"))
        elif cname in seen:
            causes.append((f"{where}.name", f'Duplicate value: "{cname}"'))
        seen.add(str(cname))
        if not container.get("image"):
            causes.append((f"{where}.image", "Required value"))
        policy = container.get("imagePullPolicy")
        if policy is not None and policy not in PULL_POLICIES:
            causes.append((f"{where}.imagePullPolicy", f'Unsupported value: "{policy}"'))
        for j, mount in enumerate(container.get("volumeMounts") or []):
            if mount.get("name") not in volumes:
                causes.append((f"{where}.volumeMounts[{j}].name", f'Not found: "{mount.get("name")}"'))
        for part in ("requests", "limits"):
            for resource, quantity in ((container.get("resources") or {}).get(part) or {}).items():
                if not QUANTITY.match(str(quantity)):
                    causes.append((f"{where}.resources.{part}[{resource}]",
                                   f'Invalid value: "{quantity}": quantities must match the regular expression '
                                   "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"))  # fmt: skip
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Always", "OnFailure", "Never"):
        causes.append(("spec.restartPolicy", f'Unsupported value: "{policy}"'))
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline < 1):
        causes.append(("spec.activeDeadlineSeconds", f"Invalid value: {deadline}: must be greater than 0"))
    return causes


def _normalise_secret(secret: dict[str, Any]) -> list[tuple[str, str]]:
    """``stringData`` folds into ``data`` (base64), as the API server does on write."""
    data = dict(secret.get("data") or {})
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            return [(f"data[{key}]", "Invalid value: illegal base64 data")]
    for key, value in (secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    secret["data"] = data
    secret.setdefault("type", "Opaque")
    return []


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the tests read the cluster's state, not its access log

    def _serve(self) -> None:
        if self.cluster.stopped:
            # Gone: kept-alive connections drop too, as when a real API server goes away.
            self.close_connection = True
            return
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.cluster.requests.append((self.command, split.path))
        try:
            if self.headers.get("Authorization") != f"Bearer {self.cluster.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                raise ApiError(400, "BadRequest", "the request body is not JSON") from None
            code, answer = self.cluster.handle(self.command, split.path, query, body)
        except ApiError as exc:
            code, answer = exc.code, exc.body
        if isinstance(answer, str):
            self._send(code, answer.encode(), "text/plain")
        else:
            self._send(code, json.dumps(answer).encode(), "application/json", answer)

    def _send(self, code: int, data: bytes, content_type: str, answer: Any = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if isinstance(answer, dict) and (answer.get("details") or {}).get("retryAfterSeconds"):
            self.send_header("Retry-After", str(answer["details"]["retryAfterSeconds"]))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve
