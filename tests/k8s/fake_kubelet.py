"""The fake API server's kubelet (and scheduler): it runs a Pod's containers as local processes.

A Pod goes Pending (scheduled, then ``ContainerCreating``) → Running → Succeeded
or Failed with its containers' real exit codes, as a one-node cluster would
move it. Images are what the test registers (:class:`FakeImage`: a working
folder standing for the image's file system, an environment, a pull time);
an image that is not registered "cannot be pulled": the container waits with
``ErrImagePull`` for a second, then ``ImagePullBackOff`` (backing off 2, 4, 8 ... s), with
the messages containerd and the kubelet give. Also as the kubelet does:

- a container whose image reference does not parse waits with
  ``InvalidImageName``; a ``secretKeyRef`` to a missing Secret or key gives
  ``CreateContainerConfigError``; a command that is not there ends the
  container at once with exit code 128 (``StartError``);
- a Pod whose Secret volume's Secret does not exist (yet) stays
  ``ContainerCreating`` until it does;
- init containers run one after the other, to the end, before the Pod's
  containers start (each inside one tick of the node: they are meant to be
  short); while they wait the containers say ``PodInitializing``, and one that
  fails fails the Pod (``restartPolicy: Never``); ``emptyDir`` volumes are
  folders the Pod's containers share;
- Secret volumes are materialised as files in a folder of the Pod's, and
  paths under a volume's ``mountPath`` in the container's env, command, args
  and working directory are rewritten to that folder (a process cannot be
  given a mount namespace here); ``$(VAR)`` in command and args expands;
- delete with a grace period sends SIGTERM to each container's main process
  and SIGKILL to everything in its session once the grace is over, then the
  Pod object goes; a Pod with nothing running (or grace 0) goes at once;
- ``activeDeadlineSeconds`` fails a Pod with ``DeadlineExceeded``; a test can
  evict a Pod (:meth:`FakeKubelet.evict`).

A container's output (stdout and stderr merged) is its log, served by
``pods/{name}/log`` and kept after the Pod is gone (:meth:`FakeKubelet.log_text`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.k8s.fake_apiserver import FakeCluster

TICK = 0.05
NODE = "fake-node-1"
REFERENCE = re.compile(
    r"^([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class FakeImage:
    """An image the fake node "has": ``workdir`` stands for its file system and working directory."""

    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    pull_seconds: float = 0.0


def iso(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def full_reference(image: str) -> str:
    """``nope:1`` → ``docker.io/library/nope:1``, as containerd names what it fails to pull."""
    name = image if ":" in image.rsplit("/", 1)[-1] or "@" in image else f"{image}:latest"
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{name}"
    return name


@dataclass
class Container:
    name: str
    proc: subprocess.Popen[bytes] | None = None
    output: IO[bytes] | None = None
    log: Path | None = None
    started_at: str = ""
    exit_code: int | None = None


@dataclass
class Runtime:
    """What the node keeps for a Pod besides its API object."""

    uid: str
    name: str
    folder: Path
    created: float = field(default_factory=time.monotonic)
    pull_started: float | None = None
    next_pull: float = 0.0
    backoff: float = 2.0
    pull_failed: bool = False
    kill_at: float | None = None
    containers: dict[str, Container] = field(default_factory=dict)
    # Every init container ran and succeeded; the volumes, made once (a Secret's file may be read-only).
    initialised: bool = False
    volumes: dict[str, Path] | None = None

    def running(self) -> list[Container]:
        return [c for c in self.containers.values() if c.proc is not None and c.exit_code is None]


class FakeKubelet:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.runtimes: dict[str, Runtime] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self.cluster.lock:
            for runtime in self.runtimes.values():
                for container in runtime.running():
                    self._kill(container, signal.SIGKILL)
                    self._wait(container)

    # ------------------------------------------------------------ the API server's calls (under its lock)

    def admit(self, pod: dict[str, Any]) -> None:
        """Defaults the API server fills in on create, and the first status."""
        spec = pod["spec"]
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("securityContext", {})
        for container in spec.get("initContainers", []) + spec["containers"]:
            tail = container["image"].rsplit("/", 1)[-1]
            latest = ":" not in tail or tail.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("resources", {})
        limited = any((c.get("resources") or {}).get("limits") for c in spec["containers"])
        requested = any((c.get("resources") or {}).get("requests") for c in spec["containers"])
        qos = "Burstable" if limited or requested else "BestEffort"
        pod["status"] = {"phase": "Pending", "qosClass": qos}

    def delete(self, ns: str, name: str, grace: int | None) -> dict[str, Any]:
        pod = self.cluster.pods[(ns, name)]
        runtime = self.runtimes.get(pod["metadata"]["uid"])
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = iso(datetime.now(UTC) + timedelta(seconds=grace))
            meta["deletionGracePeriodSeconds"] = grace
            meta["resourceVersion"] = self.cluster.next_version()
        answer = _copy(pod)
        if runtime is None or not runtime.running() or grace == 0:
            if runtime is not None:
                for container in runtime.running():
                    self._kill(container, signal.SIGKILL)
                    self._wait(container)
            self.cluster.remove_pod(ns, name)
        else:
            for container in runtime.running():
                self._kill(container, signal.SIGTERM, session=False)
            runtime.kill_at = time.monotonic() + grace
        return answer

    def log(self, ns: str, name: str, query: dict[str, str]) -> str:
        from tests.k8s.fake_apiserver import ApiError

        pod = self.cluster.pods.get((ns, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        names = [c["name"] for c in pod["spec"]["containers"]]
        wanted = query.get("container")
        if wanted is None:
            if len(names) != 1:
                raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}, "
                               f"choose one of: [{' '.join(names)}]")  # fmt: skip
            wanted = names[0]
        if wanted not in names:
            raise ApiError(400, "BadRequest", f"container {wanted} is not valid for pod {name}")
        runtime = self.runtimes.get(pod["metadata"]["uid"])
        container = runtime.containers.get(wanted) if runtime else None
        if container is None or container.log is None:
            state = _status_of(pod, wanted).get("state", {}).get("waiting", {})
            raise ApiError(400, "BadRequest", f'container "{wanted}" in pod "{name}" is waiting to start: '
                           f"{state.get('reason', 'ContainerCreating')}")  # fmt: skip
        text = container.log.read_bytes().decode(errors="replace")
        if "tailLines" in query:
            lines = text.splitlines(keepends=True)
            count = int(query["tailLines"])
            text = "".join(lines[-count:]) if count > 0 else ""
        if "limitBytes" in query:
            text = text.encode()[: int(query["limitBytes"])].decode(errors="ignore")
        return text

    # ------------------------------------------------------------ for tests

    def log_text(self, pod_name: str, container: str = "runner") -> str:
        for runtime in list(self.runtimes.values()):
            found = runtime.containers.get(container)
            if runtime.name == pod_name and found is not None and found.log is not None and found.log.exists():
                return found.log.read_text(errors="replace")
        return ""

    def evict(self, ns: str, name: str, message: str = "The node was low on resource: memory.") -> None:
        with self.cluster.lock:
            pod = self.cluster.pods[(ns, name)]
            runtime = self.runtimes[pod["metadata"]["uid"]]
            for container in runtime.running():
                self._kill(container, signal.SIGKILL)
                self._wait(container)
            self._finish(pod, runtime, reason="Evicted", message=message)

    # ------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.wait(TICK):
            with self.cluster.lock:
                for (ns, name), pod in list(self.cluster.pods.items()):
                    runtime = self.runtimes.setdefault(
                        pod["metadata"]["uid"],
                        Runtime(pod["metadata"]["uid"], name, self.cluster.tmp / "pods" / pod["metadata"]["uid"]),
                    )
                    self._tick(ns, name, pod, runtime)
                self.cluster.collect_garbage()

    def _tick(self, ns: str, name: str, pod: dict[str, Any], runtime: Runtime) -> None:
        status = pod["status"]
        now = time.monotonic()
        if runtime.kill_at is not None and now >= runtime.kill_at:
            for container in runtime.running():
                self._kill(container, signal.SIGKILL)
        self._collect(pod, runtime)
        if pod["metadata"].get("deletionTimestamp"):
            if not runtime.running():
                self.cluster.remove_pod(ns, name)
            return
        if status["phase"] == "Pending":
            if not pod["spec"].get("nodeName"):
                self._schedule(pod)
            else:
                self._try_start(ns, pod, runtime)
        deadline = pod["spec"].get("activeDeadlineSeconds")
        if deadline and status["phase"] in ("Pending", "Running") and now - runtime.created > deadline:
            for container in runtime.running():
                self._kill(container, signal.SIGKILL)
                self._wait(container)
            self._finish(pod, runtime, reason="DeadlineExceeded",
                         message="Pod was active on the node longer than the specified deadline")  # fmt: skip

    def _schedule(self, pod: dict[str, Any]) -> None:
        pod["spec"]["nodeName"] = NODE
        at = iso()
        inits = pod["spec"].get("initContainers") or []
        if inits:
            pod["status"]["initContainerStatuses"] = [
                _container_status(c, {"waiting": {"reason": "PodInitializing"}}) for c in inits
            ]
        pod["status"].update(
            hostIP="127.0.0.1",
            hostIPs=[{"ip": "127.0.0.1"}],
            startTime=at,
            conditions=[
                _condition("PodReadyToStartContainers", "False", at),
                _condition("Initialized", "False", at, "ContainersNotInitialized")
                if inits
                else _condition("Initialized", "True", at),
                _condition("Ready", "False", at, "ContainersNotReady"),
                _condition("ContainersReady", "False", at, "ContainersNotReady"),
                _condition("PodScheduled", "True", at),
            ],
            containerStatuses=[
                _container_status(c, {"waiting": {"reason": "PodInitializing" if inits else "ContainerCreating"}})
                for c in pod["spec"]["containers"]
            ],
        )
        self._bump(pod)

    def _try_start(self, ns: str, pod: dict[str, Any], runtime: Runtime) -> None:
        inits = pod["spec"].get("initContainers") or []
        initialising = bool(inits) and not runtime.initialised
        stage = inits if initialising else pod["spec"]["containers"]
        statuses = pod["status"]["initContainerStatuses" if initialising else "containerStatuses"]
        waiting: dict[str, dict[str, str]] = {}
        for container in stage:
            problem = self._image_problem(container, runtime) or self._config_problem(ns, container)
            if problem:
                waiting[container["name"]] = problem
        if not waiting and any(self._missing_secret(ns, v) for v in pod["spec"].get("volumes") or []):
            # The kubelet retries the mount until the Secret exists (FailedMount events).
            waiting = {c["name"]: {"reason": "PodInitializing" if initialising else "ContainerCreating"} for c in stage}
        if waiting:
            changed = False
            for cstatus in statuses:
                state = {"waiting": waiting.get(cstatus["name"], {"reason": "ContainerCreating"})}
                changed |= cstatus["state"] != state
                cstatus["state"] = state
            if changed:
                self._bump(pod)
            return
        if runtime.volumes is None:
            runtime.volumes = self._materialise(ns, pod, runtime)
        mounts = runtime.volumes
        if initialising:
            for init in inits:
                if not self._run_init(ns, pod, init, runtime, mounts):
                    # restartPolicy Never: a failed init container fails the Pod; the containers never start.
                    pod["status"]["phase"] = "Failed"
                    self._bump(pod)
                    return
            runtime.initialised = True
            for cond in pod["status"]["conditions"]:
                if cond["type"] == "Initialized":
                    cond.update(status="True", lastTransitionTime=iso())
                    cond.pop("reason", None)
            for cstatus in pod["status"]["containerStatuses"]:
                cstatus["state"] = {"waiting": {"reason": "ContainerCreating"}}
            self._try_start(ns, pod, runtime)  # the containers, in the same tick
            return
        for container in pod["spec"]["containers"]:
            self._start(ns, pod, container, runtime, mounts)
        at = iso()
        for cond in pod["status"]["conditions"]:
            if cond["type"] in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
                cond.update(status="True", lastTransitionTime=at)
                cond.pop("reason", None)
        pod["status"].update(phase="Running", podIP="127.0.0.1", podIPs=[{"ip": "127.0.0.1"}])
        self._collect(pod, runtime)  # a command that could not start ends the Pod at once
        self._bump(pod)

    def _image_problem(self, container: dict[str, Any], runtime: Runtime) -> dict[str, str] | None:
        image = str(container["image"])
        if not REFERENCE.match(image):
            return {
                "reason": "InvalidImageName",
                "message": f'Failed to apply default image tag "{image}": couldn\'t parse image reference '
                f'"{image}": invalid reference format',
            }
        found = self.cluster.images.get(image)
        now = time.monotonic()
        if found is not None:
            if runtime.pull_started is None:
                runtime.pull_started = now
            if now - runtime.pull_started < found.pull_seconds:
                return {"reason": "ContainerCreating"}
            return None
        if container.get("imagePullPolicy") == "Never":
            return {
                "reason": "ErrImageNeverPull",
                "message": f'Container image "{image}" is not present with pull policy of Never',
            }
        if now >= runtime.next_pull:
            # A pull attempt, and its failure; then back off, doubling.
            runtime.pull_failed = True
            runtime.next_pull = now + runtime.backoff
            runtime.backoff = min(runtime.backoff * 2, 300)
            runtime.pull_started = now
        ref = full_reference(image)
        error = (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": '
            f'failed to resolve reference "{ref}": {ref}: not found'
        )
        if runtime.pull_started is not None and now - runtime.pull_started < 1.0:
            return {"reason": "ErrImagePull", "message": error}
        # As kubelets since 1.30 word it; older ones stop after the image's name.
        return {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}": ErrImagePull: {error}'}

    def _config_problem(self, ns: str, container: dict[str, Any]) -> dict[str, str] | None:
        for env in container.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if not ref or ref.get("optional"):
                continue
            secret = self.cluster.secrets.get((ns, ref["name"]))
            if secret is None:
                return {"reason": "CreateContainerConfigError", "message": f'secret "{ref["name"]}" not found'}
            if ref["key"] not in (secret.get("data") or {}):
                return {
                    "reason": "CreateContainerConfigError",
                    "message": f"couldn't find key {ref['key']} in Secret {ns}/{ref['name']}",
                }
        return None

    def _missing_secret(self, ns: str, volume: dict[str, Any]) -> bool:
        source = volume.get("secret")
        return bool(source) and not source.get("optional") and (ns, source["secretName"]) not in self.cluster.secrets

    def _materialise(self, ns: str, pod: dict[str, Any], runtime: Runtime) -> dict[str, Path]:
        """Each volume as a folder of the Pod's; answers {volume name: folder}."""
        folders = {}
        for volume in pod["spec"].get("volumes") or []:
            folder = runtime.folder / "volumes" / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            source = volume.get("secret")
            if source:
                data = (self.cluster.secrets.get((ns, source["secretName"])) or {}).get("data") or {}
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    target = folder / item["path"]
                    target.write_bytes(base64.b64decode(data[item["key"]]))
                    target.chmod(int(item.get("mode", source.get("defaultMode", 0o644))))
            folders[volume["name"]] = folder
        return folders

    def _run_init(
        self, ns: str, pod: dict[str, Any], spec: dict[str, Any], runtime: Runtime, volumes: dict[str, Path]
    ) -> bool:
        """One init container, run to its end; True when it succeeded."""
        argv, env, cwd = self._process(ns, pod, spec, volumes)
        log = runtime.folder / f"{spec['name']}.log"
        container = Container(spec["name"], log=log, started_at=iso())
        runtime.folder.mkdir(parents=True, exist_ok=True)
        runtime.containers[spec["name"]] = container
        with open(log, "ab") as output:
            terminated: dict[str, Any] = {"startedAt": container.started_at}
            try:
                done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                      stderr=subprocess.STDOUT, timeout=60, check=False)  # fmt: skip
            except OSError as exc:
                output.write(f"exec {argv[:1]}: {exc}\n".encode())
                container.exit_code = 128
                terminated.update(reason="StartError", message=_start_error(argv))
            else:
                container.exit_code = 128 - done.returncode if done.returncode < 0 else done.returncode
                terminated["reason"] = "Completed" if container.exit_code == 0 else "Error"
        terminated.update(exitCode=container.exit_code, finishedAt=iso())
        for cstatus in pod["status"]["initContainerStatuses"]:
            if cstatus["name"] == spec["name"]:
                cstatus.update(ready=container.exit_code == 0, started=False, state={"terminated": terminated})
        self._bump(pod)
        return container.exit_code == 0

    def _process(
        self, ns: str, pod: dict[str, Any], spec: dict[str, Any], volumes: dict[str, Path]
    ) -> tuple[list[str], dict[str, str], str]:
        """A container's argv, environment and working directory, paths under its mounts made the node's."""
        image = self.cluster.images[spec["image"]]
        mounts = sorted(
            ((m["mountPath"].rstrip("/"), volumes[m["name"]]) for m in spec.get("volumeMounts") or []),
            key=lambda m: -len(m[0]),
        )

        def translate(value: str) -> str:
            for path, folder in mounts:
                if value == path or value.startswith(path + "/"):
                    return str(folder) + value[len(path) :]
            return value

        env = {**image.env, "HOSTNAME": pod["metadata"]["name"]}
        for item in spec.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                data = (self.cluster.secrets.get((ns, ref["name"])) or {}).get("data") or {}
                if ref["key"] in data:
                    env[item["name"]] = base64.b64decode(data[ref["key"]]).decode()
            else:
                env[item["name"]] = translate(VAR.sub(lambda m: env.get(m[1], m[0]), str(item.get("value", ""))))
        argv = [
            translate(VAR.sub(lambda m: env.get(m[1], m[0]), str(a)))
            for a in (spec.get("command") or image.entrypoint) + (spec.get("args") or [])
        ]
        cwd = translate(spec["workingDir"]) if spec.get("workingDir") else str(image.workdir)
        return argv, env, cwd

    def _start(
        self, ns: str, pod: dict[str, Any], spec: dict[str, Any], runtime: Runtime, volumes: dict[str, Path]
    ) -> None:
        argv, env, cwd = self._process(ns, pod, spec, volumes)
        container = Container(spec["name"], log=runtime.folder / f"{spec['name']}.log", started_at=iso())
        runtime.folder.mkdir(parents=True, exist_ok=True)
        runtime.containers[spec["name"]] = container
        container.output = open(container.log, "ab")  # noqa: SIM115 - held open while the process writes
        try:
            container.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=container.output,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            container.output.write(f"exec {argv[:1]}: {exc}\n".encode())
            container.output.close()
            container.exit_code = 128
            container.started_at = ""
            self._set_state(pod, spec["name"], {"terminated": {
                "exitCode": 128, "reason": "StartError", "startedAt": iso(), "finishedAt": iso(),
                "message": _start_error(argv),
            }})  # fmt: skip
            return
        self._set_state(pod, spec["name"], {"running": {"startedAt": container.started_at}}, ready=True)

    def _collect(self, pod: dict[str, Any], runtime: Runtime) -> None:
        """Notice containers that exited; the Pod ends when all have (restartPolicy Never)."""
        changed = False
        for container in runtime.containers.values():
            if container.proc is None or container.exit_code is not None:
                continue
            try:
                # WNOWAIT: look without reaping, so the exited main process keeps its pid (the
                # session's id) while the rest of its session is killed: the container's end takes
                # every process in it.
                exited = os.waitid(os.P_PID, container.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:
                exited = True
            if not exited:
                continue
            self._kill(container, signal.SIGKILL)
            code = container.proc.wait()
            container.exit_code = 128 - code if code < 0 else code
            if container.output is not None:
                container.output.close()
            self._set_state(pod, container.name, {"terminated": {
                "exitCode": container.exit_code, "reason": "Completed" if container.exit_code == 0 else "Error",
                "startedAt": container.started_at, "finishedAt": iso(),
                "containerID": f"containerd://{container.proc.pid:064x}",
            }})  # fmt: skip
            changed = True
        names = [c["name"] for c in pod["spec"]["containers"]]
        ended = all(n in runtime.containers and runtime.containers[n].exit_code is not None for n in names)
        if ended and pod["status"]["phase"] in ("Pending", "Running"):
            self._finish(pod, runtime)
        elif changed:
            self._bump(pod)

    def _finish(self, pod: dict[str, Any], runtime: Runtime, reason: str = "", message: str = "") -> None:
        status = pod["status"]
        codes = [c.exit_code for c in runtime.containers.values()]
        status["phase"] = "Succeeded" if not reason and codes and all(c == 0 for c in codes) else "Failed"
        if reason:
            status.update(reason=reason, message=message)
            for cstatus in status.get("containerStatuses") or []:
                if "terminated" not in cstatus["state"]:
                    started = (cstatus["state"].get("running") or {}).get("startedAt")
                    cstatus["state"] = {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": iso(),
                                                       **({"startedAt": started} if started else {})}}  # fmt: skip
                    cstatus["ready"] = False
        for cond in status.get("conditions") or []:
            if cond["type"] in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
                cond.update(status="False", reason="PodCompleted", lastTransitionTime=iso())
        self._bump(pod)

    # ------------------------------------------------------------ helpers

    def _set_state(self, pod: dict[str, Any], name: str, state: dict[str, Any], ready: bool = False) -> None:
        for cstatus in pod["status"]["containerStatuses"]:
            if cstatus["name"] == name:
                cstatus.update(state=state, ready=ready, started="running" in state)
                cstatus["imageID"] = f"{full_reference(cstatus['image'])}@sha256:{'0' * 64}"
                if "running" in state or "terminated" in state:
                    cstatus["containerID"] = f"containerd://{pod['metadata']['uid'].replace('-', '')}{name}"
        self._bump(pod)

    def _bump(self, pod: dict[str, Any]) -> None:
        pod["metadata"]["resourceVersion"] = self.cluster.next_version()

    def _kill(self, container: Container, signum: int, *, session: bool = True) -> None:
        """A signal to the container's main process, or (``session``) to every process in its session."""
        if container.proc is None or (container.proc.returncode is not None and not session):
            return
        pid = container.proc.pid
        targets = [pid] if not session else _session_members(pid)
        for target in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signum)

    def _wait(self, container: Container) -> None:
        if container.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = container.proc.wait(10)
                if container.exit_code is None:
                    container.exit_code = 128 - code if code < 0 else code
            if container.output is not None:
                container.output.close()


def _start_error(argv: list[str]) -> str:
    """What containerd says of a container whose command is not in the image."""
    return (
        "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
        f'failed: unable to start container process: exec: "{argv[0] if argv else ""}": executable file not found '
        "in $PATH: unknown"
    )


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
            members.append(int(entry))
    return members


def _condition(kind: str, status: str, at: str, reason: str | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": at}
    if reason:
        cond["reason"] = reason
    return cond


def _container_status(container: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "state": state,
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "started": False,
    }


def _status_of(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for cstatus in pod["status"].get("containerStatuses") or []:
        if cstatus["name"] == name:
            return dict(cstatus)
    return {}


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    import copy

    return copy.deepcopy(obj)
