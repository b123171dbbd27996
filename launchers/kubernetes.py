"""The Kubernetes launcher: each runner is a Pod, created through the official ``kubernetes`` client.

For each claimed run it creates, in its namespace:

- a **Pod** ``gantry-<run id>-<runner id's first 8>`` with ``restartPolicy:
  Never``, labelled ``gantry.io/group-id``, ``gantry.io/run-id``,
  ``gantry.io/runner-id`` (and ``app.kubernetes.io/managed-by: gantry``); one
  container, ``runner``, runs ``python3 -m runners.ephemeral`` in the image's
  working directory, with the server URL and the run and runner ids in its
  environment;
- then a **Secret** ``<pod name>-token`` holding the runner token, owned by the
  Pod (``ownerReferences`` with the Pod's uid: deleting the Pod deletes it).
  The kubelet holds the Pod in ``ContainerCreating`` until the Secret exists;
  then an init container, ``runner-token``, copies it into a memory volume
  (mode 0400, the image's user) where ``GANTRY_RUNNER_TOKEN_FILE`` points, and
  the runner deletes it once read (launchers/kubernetes_pod.py says why a
  Secret volume alone would not do). The token is never in the Pod's spec
  (env, args, labels, annotations), so ``kubectl get pod -o yaml`` does not
  show it.

``discover`` lists the Pods carrying this group's label (nothing else: two
groups may share a namespace); ``is_alive`` reads the Pod's phase; ``reap``
takes the runner container's exit code from its terminated state, then
deletes the Pod and its Secret (in case no garbage collector runs);
``terminate`` deletes the Pod with a grace period (the kubelet sends SIGTERM,
then SIGKILL after the grace); ``last_lines`` reads the Pod's log.

Startup guards: a Pod whose container waits with ``ErrImagePull``,
``ImagePullBackOff``, ``InvalidImageName``, ``CreateContainerConfigError``,
``CreateContainerError`` (and their kin) past ``startup_grace`` seconds, or
whose container could not start at all (``StartError``), is a startup
failure: the coordinator deletes it and reports the run as dispatch-failed
with Kubernetes' own message. A finished Pod is reaped and never created again
(a Pod is bare, owned by no controller, so nothing re-creates it either): a
runner token serves exactly one Pod.

API errors on create: 4xx (forbidden, invalid, no such namespace) are
permanent; 429, 5xx and an API server that does not answer are transient (the
coordinator retries within the lease).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gantry_wire.logsetup import event
from launchers import register
from launchers.base import Assignment, Launcher, LaunchError, WorkerHandle
from launchers.kubernetes_pod import (
    CONTAINER,
    LABEL_GROUP,
    LABEL_RUN,
    LABEL_RUNNER,
    MANAGED_BY,
    TOKEN_INIT,
    PodOptions,
    parse_options,
    pod_manifest,
    pod_name,
    secret_manifest,
)

log = logging.getLogger("gantry.launcher.kubernetes")

# Connect and read timeouts of every call: no API call may hold the coordinator's loop for long.
REQUEST_TIMEOUT = (5.0, 30.0)
# Waiting reasons that mean "this container will not start by itself": past the grace, a startup failure.
STARTUP_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "RegistryUnavailable",
        "SignatureValidationFailed",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
# Terminated reasons of a container that never ran (its command could not be executed).
NEVER_STARTED = frozenset({"StartError", "ContainerCannotRun", "InitError"})
FINISHED = frozenset({"Succeeded", "Failed"})
# Errors that mean "the API server did not answer" (refused, reset, timed out, TLS).
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MESSAGE_LIMIT = 2000


@dataclass
class PodView:
    """What the launcher needs of a Pod's status, read at ``read_at`` (epoch seconds)."""

    phase: str
    reason: str = ""
    message: str = ""
    waiting_reason: str = ""
    waiting_message: str = ""
    exit_code: int | None = None
    terminated_reason: str = ""
    terminated_message: str = ""
    deleting: bool = False
    read_at: float = field(default_factory=time.time)

    @classmethod
    def of(cls, pod: Any) -> PodView:
        status = pod.status
        view = cls(
            phase=str(getattr(status, "phase", None) or "Pending"),
            reason=str(getattr(status, "reason", None) or ""),
            message=str(getattr(status, "message", None) or ""),
            deleting=pod.metadata.deletion_timestamp is not None,
        )
        for cstatus in getattr(status, "container_statuses", None) or []:
            if cstatus.name != CONTAINER or cstatus.state is None:
                continue
            if cstatus.state.waiting is not None:
                view.waiting_reason = str(cstatus.state.waiting.reason or "")
                view.waiting_message = str(cstatus.state.waiting.message or "")
            if cstatus.state.terminated is not None:
                view.exit_code = cstatus.state.terminated.exit_code
                view.terminated_reason = str(cstatus.state.terminated.reason or "")
                view.terminated_message = str(cstatus.state.terminated.message or "")
        for cstatus in getattr(status, "init_container_statuses", None) or []:
            if cstatus.name != TOKEN_INIT or cstatus.state is None:
                continue
            # The token's hand-over runs the runner's image first: while it waits (an image that will not
            # pull), the runner only says PodInitializing, so its reason is the runner's.
            if cstatus.state.waiting is not None and cstatus.state.waiting.reason != "PodInitializing":
                view.waiting_reason = str(cstatus.state.waiting.reason or "")
                view.waiting_message = str(cstatus.state.waiting.message or "")
            terminated = cstatus.state.terminated
            if terminated is not None and terminated.exit_code != 0 and view.exit_code is None:
                # The runner never ran: a startup failure, like a runner command that could not be run.
                reason = str(terminated.reason or "")
                view.terminated_reason = reason if reason in NEVER_STARTED else "InitError"
                view.terminated_message = (
                    f"the runner token's hand-over ({TOKEN_INIT} init container) exited with code "
                    f"{terminated.exit_code}: {terminated.message or reason}"
                ).rstrip(": ")
        return view

    @property
    def never_started(self) -> bool:
        return self.terminated_reason in NEVER_STARTED


def api_message(exc: ApiException) -> str:
    """The API's own words: the ``message`` of the Status object it answered with."""
    try:
        message = json.loads(exc.body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or f"HTTP {exc.status}")


def launch_error(exc: Exception, doing: str) -> LaunchError:
    """4xx: the request itself is refused (permanent); 429, 5xx, no answer: try again (transient)."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        permanent = 400 <= status < 500 and status not in (408, 409, 429)
        return LaunchError(f"{doing}: {api_message(exc)} (HTTP {status})"[:MESSAGE_LIMIT], permanent=permanent)
    return LaunchError(f"{doing}: the Kubernetes API did not answer: {exc}"[:MESSAGE_LIMIT], permanent=False)


def load_api(context: str = "") -> tuple[Any, str]:
    """A CoreV1Api as the client configures itself, and the namespace that configuration names ("" if none).

    ``KUBECONFIG`` (or ``~/.kube/config``) when set or outside a cluster; the
    Pod's service account (``load_incluster_config``) inside one.
    """
    configuration = client.Configuration()
    kubeconfig = os.environ.get("KUBECONFIG") or None
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
            namespace = NAMESPACE_FILE.read_text().strip() if NAMESPACE_FILE.exists() else ""
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context or None, client_configuration=configuration,
                persist_config=False,
            )  # fmt: skip
            contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
            chosen = next((c for c in contexts if c.get("name") == context), current) if context else current
            namespace = str(((chosen or {}).get("context") or {}).get("namespace") or "")
    except (config.ConfigException, OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ValueError(f"kubernetes launcher: no usable Kubernetes configuration: {exc}") from exc
    return client.CoreV1Api(client.ApiClient(configuration)), namespace


@register("kubernetes")
class KubernetesLauncher(Launcher):
    def __init__(self, api: Any, options: PodOptions) -> None:
        self.api = api
        self.options = options
        self.namespace = options.namespace
        # The last status read of each worker's Pod: is_alive reads it, startup_failure reuses it.
        self._views: dict[str, PodView] = {}

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, state_dir: Path) -> Launcher:
        """Options: docs/launchers.md (``image`` required); unknown keys and bad values raise ValueError."""
        parsed, context = parse_options(options, env=os.environ)
        api, configured = load_api(context)
        if not parsed.namespace:
            parsed = replace(parsed, namespace=configured or "default")
        launcher = cls(api, parsed)
        launcher.preflight()
        return launcher

    def close(self) -> None:
        self.api.api_client.close()

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return method(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)

    def preflight(self) -> None:
        """A server-side dry run of a runner Pod: a refused one (no such namespace, forbidden, a bad
        ``pod_template`` or quantity) fails the coordinator's start rather than every run it would claim."""
        placeholder = Assignment(
            server=self.options.server_url or "http://gantry.invalid", run_id="00000000-0000-0000-0000-000000000000",
            runner_id="00000000-0000-0000-0000-000000000000", runner_token="", group_id=self.group_id or "0",
        )  # fmt: skip
        try:
            self._call(self.api.create_namespaced_pod, self.namespace, pod_manifest(placeholder, self.options),
                       dry_run="All")  # fmt: skip
        except ApiException as exc:
            error = launch_error(exc, f"a runner Pod in namespace {self.namespace!r} is refused")
            if error.permanent:
                raise ValueError(f"kubernetes launcher: {error.message}") from exc
            event(log, "launcher.preflight_skipped", "could not check the runner Pod: %s", error.message,
                  level=logging.WARNING)  # fmt: skip
        except TRANSPORT_ERRORS as exc:
            # The API server may come up after the coordinator: not a reason to refuse to start.
            event(log, "launcher.preflight_skipped", "could not check the runner Pod: %s", exc, level=logging.WARNING)

    # ------------------------------------------------------------ launch

    def launch(self, assignment: Assignment) -> WorkerHandle:
        name = pod_name(assignment)
        try:
            pod = self._call(self.api.create_namespaced_pod, self.namespace, pod_manifest(assignment, self.options))
        except ApiException as exc:
            if exc.status != 409:
                raise launch_error(exc, f"cannot create Pod {self.namespace}/{name}") from exc
            pod = self._adopt(name, assignment)
        except TRANSPORT_ERRORS as exc:
            raise launch_error(exc, f"cannot create Pod {self.namespace}/{name}") from exc
        try:
            self._create_secret(assignment, pod)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            # Without its Secret the Pod would wait for its volume forever: take it back. A retried
            # launch creates both again.
            self._delete_pod(name, grace=0)
            raise launch_error(exc, f"cannot create the token Secret of Pod {self.namespace}/{name}") from exc
        handle = self._handle(pod, started_at=time.time())
        assert handle is not None  # our own labels
        return handle

    def _adopt(self, name: str, assignment: Assignment) -> Any:
        """A Pod of this name exists: an earlier attempt whose answer was lost, if it is this runner's."""
        try:
            pod = self._call(self.api.read_namespaced_pod, name, self.namespace)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise launch_error(exc, f"Pod {self.namespace}/{name} exists and cannot be read") from exc
        labels = pod.metadata.labels or {}
        if labels.get(LABEL_RUNNER) != assignment.runner_id:
            raise LaunchError(f"Pod {self.namespace}/{name} exists and belongs to another runner", permanent=True)
        if pod.metadata.deletion_timestamp is not None:
            raise LaunchError(f"Pod {self.namespace}/{name} from an earlier attempt is still being deleted")
        return pod

    def _create_secret(self, assignment: Assignment, pod: Any) -> None:
        body = secret_manifest(assignment, self.options, pod_uid=pod.metadata.uid)
        name = body["metadata"]["name"]
        try:
            self._call(self.api.create_namespaced_secret, self.namespace, body)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
        # It exists: ours from a lost answer (keep it), or owned by an earlier Pod of this name, which
        # the garbage collector is about to take with it (replace it).
        existing = self._call(self.api.read_namespaced_secret, name, self.namespace)
        owners = {ref.uid for ref in existing.metadata.owner_references or []}
        if pod.metadata.uid in owners:
            return
        self._call(self.api.delete_namespaced_secret, name, self.namespace)
        self._call(self.api.create_namespaced_secret, self.namespace, body)

    def _handle(self, pod: Any, *, started_at: float | None = None) -> WorkerHandle | None:
        meta = pod.metadata
        labels = meta.labels or {}
        if not labels.get(LABEL_RUN) or not labels.get(LABEL_RUNNER):
            return None
        if started_at is None:
            created = meta.creation_timestamp
            started_at = created.timestamp() if created is not None else time.time()
        return WorkerHandle(
            kind=self.kind,
            run_id=labels[LABEL_RUN],
            runner_id=labels[LABEL_RUNNER],
            ident=meta.name,
            started_at=started_at,
            meta={"namespace": self.namespace, "pod": meta.name, "secret": f"{meta.name}-token", "uid": meta.uid},
        )

    # ------------------------------------------------------------ status

    def _read(self, handle: WorkerHandle) -> PodView | None:
        """The Pod's status now (None: the Pod is gone); API errors propagate."""
        try:
            pod = self._call(self.api.read_namespaced_pod, handle.meta["pod"], self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                self._views.pop(handle.run_id, None)
                return None
            raise
        if pod.metadata.uid != handle.meta.get("uid"):
            return None  # a Pod of the same name, not ours: ours is gone
        return self._remember(handle, PodView.of(pod))

    def _remember(self, handle: WorkerHandle, view: PodView) -> PodView:
        if view.waiting_reason == "ErrImagePull" and view.waiting_message:
            # ImagePullBackOff only says "Back-off pulling image": keep the pull's own error for the report.
            handle.meta["pull_error"] = view.waiting_message
        self._views[handle.run_id] = view
        return view

    def discover(self) -> list[WorkerHandle]:
        """This group's Pods; finished ones are reaped here (nothing re-creates them)."""
        selector = f"{MANAGED_BY}=gantry,{LABEL_GROUP}={self.group_id}"
        pods = self._with_retries(lambda: self._call(self.api.list_namespaced_pod, self.namespace,
                                                     label_selector=selector))  # fmt: skip
        alive: list[WorkerHandle] = []
        for pod in pods.items:
            handle = self._handle(pod)
            if handle is None:
                continue
            view = self._remember(handle, PodView.of(pod))
            if view.phase in FINISHED and not view.never_started:
                code = self.reap(handle)
                event(log, "worker.exited", "worker for run %s exited with code %s (while no coordinator watched)",
                      handle.run_id, "unknown" if code is None else code, run_id=handle.run_id,
                      worker=handle.ident, exit_code=code)  # fmt: skip
                continue
            if view.phase == "Pending" and not self._secret_exists(handle):
                # The coordinator stopped between creating the Pod and its Secret: the token is gone
                # with it, so this Pod can never start.
                handle.meta["orphaned"] = True
            alive.append(handle)
        return alive

    def _with_retries(self, call: Callable[[], Any], attempts: int = 5) -> Any:
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                error = launch_error(exc, "cannot list this group's Pods")
                if error.permanent or attempt == attempts:
                    raise
                event(log, "launcher.retry", "%s; retrying", error.message, level=logging.WARNING)
                time.sleep(2 ** (attempt - 1))
        raise AssertionError("unreachable")

    def _secret_exists(self, handle: WorkerHandle) -> bool:
        try:
            self._call(self.api.read_namespaced_secret, handle.meta["secret"], self.namespace)
        except ApiException as exc:
            return exc.status != 404
        except TRANSPORT_ERRORS:
            return True  # cannot tell: do not condemn the Pod
        return True

    def is_alive(self, handle: WorkerHandle) -> bool:
        try:
            view = self._read(handle)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            # Not knowing is not "dead": reaping would delete a Pod that may be running a run.
            event(log, "worker.status_unknown", "cannot read Pod %s: %s", handle.ident,
                  launch_error(exc, "read").message, level=logging.WARNING, run_id=handle.run_id)  # fmt: skip
            return True
        if view is None:
            return False
        if view.phase in FINISHED:
            # A container that never ran is a startup failure (dispatch-failed), not a runner that exited:
            # stay "alive" so the coordinator asks startup_failure.
            return view.never_started and not handle.meta.get("terminating")
        return True

    def startup_failure(self, handle: WorkerHandle) -> LaunchError | None:
        where = f"Pod {self.namespace}/{handle.ident}"
        if handle.meta.get("orphaned"):
            return LaunchError(f"{where} has no token Secret (its coordinator stopped while creating it)",
                               permanent=True)  # fmt: skip
        view = self._views.get(handle.run_id)
        if view is None or time.time() - view.read_at > 1.0:
            try:
                view = self._read(handle)
            except (ApiException, *TRANSPORT_ERRORS):
                return None
        if view is None:
            return None
        if view.never_started:
            detail = view.terminated_message or "the container's command could not be run"
            return LaunchError(f"{where}: {view.terminated_reason}: {detail}"[:MESSAGE_LIMIT], permanent=True)
        if view.phase != "Pending" or view.waiting_reason not in STARTUP_FAILURES:
            return None
        if time.time() - handle.started_at < self.options.startup_grace:
            return None
        message = f"{where} cannot start its runner: {view.waiting_reason}: {view.waiting_message}"
        pull_error = handle.meta.get("pull_error")
        if view.waiting_reason == "ImagePullBackOff" and pull_error and pull_error not in view.waiting_message:
            # Kubelets before 1.30 say only 'Back-off pulling image "x"'.
            message += f" (last pull: {pull_error})"
        return LaunchError(message[:MESSAGE_LIMIT], permanent=True)

    def last_lines(self, handle: WorkerHandle, limit: int = 20) -> list[str]:
        """The tail of the runner container's log, and a last line for what Kubernetes says of the Pod
        when it ended abnormally (evicted, OOM-killed, past its deadline)."""
        lines: list[str] = []
        try:
            # Unparsed: the client would json.loads a log that happens to be one JSON line.
            response = self._call(self.api.read_namespaced_pod_log, handle.meta["pod"], self.namespace,
                                  container=CONTAINER, tail_lines=limit, _preload_content=False)  # fmt: skip
            try:
                lines = response.data.decode(errors="replace").splitlines()
            finally:
                response.release_conn()
        except (ApiException, *TRANSPORT_ERRORS):
            pass
        view = self._views.get(handle.run_id)
        note = ""
        if view is not None and view.reason:
            note = f"[kubernetes] Pod {handle.ident} {view.phase}: {view.reason}: {view.message}"
        elif view is not None and view.terminated_reason not in ("", "Completed", "Error"):
            note = f"[kubernetes] container {CONTAINER} {view.terminated_reason}: {view.terminated_message}".rstrip(
                ": "
            )
        if note:
            lines = [*lines[-(limit - 1) :], note] if limit > 1 else [note]
        return lines[-limit:] if limit > 0 else []

    # ------------------------------------------------------------ terminate / reap

    def terminate(self, handle: WorkerHandle, grace: float = 10.0) -> None:
        """Delete the Pod with ``grace`` seconds between SIGTERM and SIGKILL; the kubelet does the rest."""
        handle.meta["terminating"] = True
        self._delete_pod(handle.meta["pod"], grace=max(0, math.ceil(grace)))

    def reap(self, handle: WorkerHandle) -> int | None:
        try:
            view = self._read(handle)
        except (ApiException, *TRANSPORT_ERRORS):
            view = None
        if view is None:
            view = self._views.get(handle.run_id)
        self._delete_pod(handle.meta["pod"], grace=0)
        # Normally the garbage collector takes the Secret with its Pod; not every cluster runs one promptly.
        self._delete(self.api.delete_namespaced_secret, handle.meta["secret"])
        self._views.pop(handle.run_id, None)
        return view.exit_code if view is not None else None

    def _delete_pod(self, name: str, *, grace: int) -> None:
        self._delete(self.api.delete_namespaced_pod, name, grace_period_seconds=grace)

    def _delete(self, method: Callable[..., Any], name: str, **kwargs: Any) -> None:
        try:
            self._call(method, name, self.namespace, **kwargs)
        except ApiException as exc:
            if exc.status != 404:
                event(log, "worker.delete_failed", "cannot delete %s: %s", name, launch_error(exc, "delete").message,
                      level=logging.WARNING, worker=name)  # fmt: skip
        except TRANSPORT_ERRORS as exc:
            # Left behind: the next discover() (or coordinator start) finds it by its labels and reaps it.
            event(log, "worker.delete_failed", "cannot delete %s: %s", name, exc, level=logging.WARNING, worker=name)
