"""The Docker launcher: each runner is a container on a Docker engine (``--launcher docker``).

One container per run, from the runner image (``python3 dev.py runner-image``;
its entrypoint is ``python3 -m runners.ephemeral``), named
``gantry-<runner id>`` and labelled::

    gantry.io/managed=true
    gantry.io/group-id=<the coordinator's runner group>
    gantry.io/run-id=<run id>
    gantry.io/runner-id=<runner id>

The labels are the launcher's whole state: :meth:`DockerLauncher.discover`
lists the containers carrying this group's labels, so a restarted coordinator
(or a new one on the same engine) re-attaches to its own workers and never
sees another group's. The engine is found the way the Docker CLI finds it
(``DOCKER_HOST``, else the local socket).

The runner token never enters the container's configuration (environment,
command, labels: all of it shows in ``docker inspect``). The container is
created, the token is copied in as a file with ``put_archive`` (mode 0400,
owned by the image's user), and only then started; ``GANTRY_RUNNER_TOKEN_FILE``
names the file, and the runner deletes it once read.

A reaped container is removed, unless the ``keep`` option keeps it for
inspection: it is then renamed ``<name>-reaped`` so a later discover passes it by.

Warm runners (``--warm N``, runners.warm): a container of the runner image
running ``python3 -m runners.ephemeral --warm warm-<id>`` as the image's user,
named ``gantry-warm-<id>``, labelled ``gantry.io/managed``, ``gantry.io/group-id``
and ``gantry.io/warm=warm-<id>`` (no run, no runner, no token: nothing of a
run is in it). It is created with its stdin open and ``StdinOnce``; the
launcher attaches to that stdin before the start and holds the socket.
:meth:`DockerLauncher.assign_warm` renames the container to
``gantry-<runner id>.run-<run id>`` (labels cannot change after creation; the
name can, and only the engine's API sets it, so it is as trustworthy as a
label), then writes the one JSON claim line (the run's variables, the runner
token among them: stdin is private to the attach, unlike the configuration
``docker inspect`` shows) and closes the socket, which closes the container's
stdin. From then on the container is an ordinary worker: discover reads its run
and runner from that name. An idle warm container whose coordinator is gone
reads end-of-file (the attach closed with its process) and exits 0 holding
nothing; discover removes such idle ones.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import socket
import tarfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from gantry_wire.logsetup import event
from launchers import register
from launchers.base import Assignment, Launcher, LaunchError, WarmWorker, WorkerHandle

log = logging.getLogger("gantry.launcher.docker")

LABEL_MANAGED = "gantry.io/managed"
LABEL_GROUP = "gantry.io/group-id"
LABEL_RUN = "gantry.io/run-id"
LABEL_RUNNER = "gantry.io/runner-id"
# A warm runner's id (``warm-<hex>``): set on every warm container, taken or idle.
LABEL_WARM = "gantry.io/warm"
# A taken warm container's name: its run and runner, which its labels (fixed at creation) cannot carry.
_TAKEN_NAME = re.compile(r"^/?gantry-(?P<runner>[A-Za-z0-9_-]+)\.run-(?P<run>[A-Za-z0-9_-]+?)(?:-reaped)?$")
# Where the token file goes in the container: /tmp exists in every image and
# is sticky, so the runner (the file's owner) may delete its file there.
TOKEN_DIR = "/tmp"
TOKEN_NAME = "gantry-runner-token"
# What a runner inherits from the coordinator's environment besides the `env` option's names.
INHERITED_ENV = ("GANTRY_LOG_LEVEL", "GANTRY_STOP_GRACE")
# Credentials the `env` option may not pass on: the group's token above all.
SECRET_ENV = ("GANTRY_GROUP_TOKEN", "GANTRY_GROUP_TOKEN_FILE", "GANTRY_RUNNER_TOKEN", "GANTRY_RUNNER_TOKEN_FILE")
PULL_POLICIES = ("never", "missing", "always")
# A container in one of these states still holds its run.
LIVE_STATES = frozenset({"created", "running", "paused", "restarting"})
REAPED_SUFFIX = "-reaped"
OPTIONS = ("image", "network", "server_url", "pull", "cpus", "memory", "env", "volume", "keep")
_MEMORY = re.compile(r"^(\d+)([bkmg]?)$", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A refused connection or a timeout: the engine may answer later.
UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)


@dataclass(frozen=True)
class DockerOptions:
    """The ``--launcher-option`` pairs, checked (docs/launchers.md lists them)."""

    image: str
    network: str | None = None
    server_url: str | None = None
    pull: str = "missing"
    nano_cpus: int | None = None
    memory: int | None = None
    env: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    keep: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DockerOptions:
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise ValueError(
                f"unknown docker launcher options: {', '.join(sorted(unknown))} (known: {', '.join(OPTIONS)})"
            )
        image = options.get("image", "").strip()
        if not image:
            raise ValueError("the docker launcher needs --launcher-option image=IMAGE (e.g. gantry-runner:local)")
        pull = options.get("pull", "missing")
        if pull not in PULL_POLICIES:
            raise ValueError(f"docker launcher option pull={pull!r}: one of {', '.join(PULL_POLICIES)}")
        return cls(
            image=image,
            network=options.get("network") or None,
            server_url=(options.get("server_url") or "").rstrip("/") or None,
            pull=pull,
            nano_cpus=_parse_cpus(options["cpus"]) if options.get("cpus") else None,
            memory=_parse_memory(options["memory"]) if options.get("memory") else None,
            env=_parse_env(options.get("env", "")),
            volumes=tuple(_parse_volume(v) for v in _split(options.get("volume", ""))),
            keep=_parse_bool("keep", options.get("keep", "false")),
        )


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _parse_cpus(value: str) -> int:
    try:
        cpus = float(value)
    except ValueError:
        cpus = 0.0
    if not 0 < cpus < 10_000:
        raise ValueError(f"docker launcher option cpus={value!r}: a positive number of CPUs (e.g. 1.5)")
    return int(cpus * 1e9)  # the engine's unit: billionths of a CPU


def _parse_memory(value: str) -> int:
    match = _MEMORY.match(value.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"docker launcher option memory={value!r}: bytes with an optional unit b, k, m, g (512m)")
    return int(match.group(1)) * 1024 ** "bkmg".index((match.group(2) or "b").lower())


def _parse_env(value: str) -> tuple[str, ...]:
    names = _split(value)
    for name in names:
        if not _ENV_NAME.match(name):
            raise ValueError(f"docker launcher option env: {name!r} is not an environment variable name")
        if name in SECRET_ENV:
            raise ValueError(f"docker launcher option env: {name} is a Gantry credential and never passed on")
    return tuple(names)


def _parse_volume(spec: str) -> str:
    """``SOURCE:TARGET[:ro|rw]``: a host path or a named volume, mounted at an absolute path."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/"):
        raise ValueError(f"docker launcher option volume={spec!r}: SOURCE:/container/path[:ro|rw]")
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        raise ValueError(f"docker launcher option volume={spec!r}: the mode is ro or rw, not {parts[2]!r}")
    return spec


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"docker launcher option {name}={value!r}: true or false")


def _explain(exc: BaseException) -> str:
    """The engine's own words (``No such image: ...``) rather than the SDK's URL-laden wrapper."""
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def launch_error(exc: Exception, doing: str) -> LaunchError:
    """A Docker failure as the coordinator needs it: permanent when trying again cannot help."""
    if isinstance(exc, ImageNotFound):
        return LaunchError(f"docker: cannot {doing}: {_explain(exc)}", permanent=True)
    if isinstance(exc, APIError):
        status = exc.status_code or 500
        # 4xx is the engine refusing this request (a bad image reference, a
        # denied pull, a bad mount); a conflict, a rate limit or a 5xx may pass.
        permanent = 400 <= status < 500 and status not in (408, 409, 429)
        return LaunchError(f"docker: cannot {doing}: {_explain(exc)}", permanent=permanent)
    if isinstance(exc, (*UNREACHABLE, DockerException)):
        return LaunchError(f"docker: cannot {doing}: the Docker engine is unreachable: {exc}", permanent=False)
    return LaunchError(f"docker: cannot {doing}: {type(exc).__name__}: {exc}", permanent=True)


def _token_archive(token: str, uid: int, gid: int) -> bytes:
    """A tar holding the token file, mode 0400, owned by the container's user (the engine keeps the owner)."""
    data = token.encode()
    info = tarfile.TarInfo(TOKEN_NAME)
    info.size = len(data)
    info.mode = 0o400
    info.uid, info.gid = uid, gid
    info.mtime = int(time.time())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _parse_started(value: str | None) -> float:
    """The engine's RFC 3339 timestamp (nanoseconds, ``Z``) as epoch seconds; now when it says nothing."""
    if not value or value.startswith("0001-"):
        return time.time()
    match = re.match(r"^(.*?T\d\d:\d\d:\d\d)(\.\d+)?(.*)$", value)
    if not match:
        return time.time()
    head, fraction, zone = match.groups()
    text = head + (fraction or "")[:7] + (zone if zone not in ("Z", "") else "+00:00")
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return time.time()


@register("docker")
class DockerLauncher(Launcher):
    supports_warm = True

    def __init__(self, options: DockerOptions, *, client: Any = None) -> None:
        self.options = options
        # Made on first use: the SDK asks the engine for its API version as it
        # connects, and an engine that is down must fail a launch (transient), not the start-up.
        self._docker = client
        # Warm containers waiting for a claim, by warm id: the socket attached to each one's stdin.
        self._warm: dict[str, Any] = {}

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, state_dir: Path) -> Launcher:
        """Options: image (required), network, server_url, pull, cpus, memory, env, volume, keep."""
        return cls(DockerOptions.parse(options))

    def _client(self) -> Any:
        if self._docker is None:
            self._docker = docker.from_env()
        return self._docker

    def _get(self, handle: WorkerHandle) -> Any:
        return self._client().containers.get(handle.meta["container_id"])

    # ------------------------------------------------------------ launch

    def _base_env(self) -> dict[str, str]:
        """What every runner this launcher starts gets, warm or cold: nothing of a run."""
        names = (*INHERITED_ENV, *self.options.env)
        env = {name: os.environ[name] for name in names if name in os.environ}
        env["GANTRY_LAUNCHER"] = "docker"
        return env

    def _run_env(self, assignment: Assignment) -> dict[str, str]:
        """The run's part (no credential): in a cold container's environment, or down a warm one's stdin."""
        return {
            "GANTRY_SERVER": self.options.server_url or assignment.server,
            "GANTRY_RUN_ID": assignment.run_id,
            "GANTRY_RUNNER_ID": assignment.runner_id,
        }

    def _env(self, assignment: Assignment) -> dict[str, str]:
        # The path only: the token itself is copied in before the start.
        token_file = {"GANTRY_RUNNER_TOKEN_FILE": f"{TOKEN_DIR}/{TOKEN_NAME}"}
        return {**self._base_env(), **self._run_env(assignment), **token_file}

    def labels(self, assignment: Assignment) -> dict[str, str]:
        return {
            LABEL_MANAGED: "true",
            LABEL_GROUP: self.group_id,
            LABEL_RUN: assignment.run_id,
            LABEL_RUNNER: assignment.runner_id,
        }

    def _ensure_image(self, client: Any) -> None:
        image = self.options.image
        if self.options.pull == "always":
            client.images.pull(image)
            return
        try:
            client.images.get(image)
        except ImageNotFound as exc:
            if self.options.pull == "never":
                raise LaunchError(
                    f"docker: image {image} is not on the engine and pull=never: {_explain(exc)}", permanent=True
                ) from exc
            client.images.pull(image)

    def _create(
        self, name: str, labels: dict[str, str], environment: dict[str, str], *, stdin: bool = False, **extra: Any
    ) -> Any:
        """A container of the runner image, created (not started); :class:`LaunchError` when it cannot be.

        ``stdin``: its stdin open, and closed when the first attach ends (``StdinOnce``).
        """
        opts = self.options
        doing = f"pull {opts.image}"
        try:
            client = self._client()
            self._ensure_image(client)
            doing = f"create a container from {opts.image}"
            network: dict[str, str] = {}
            if opts.network in ("host", "none", "bridge"):
                network["network_mode"] = opts.network
            elif opts.network:
                network["network"] = opts.network
            return client.containers.create(
                opts.image,
                name=name,
                labels=labels,
                environment=environment,
                # The SDK sets StdinOnce only for a container it calls attached (not
                # detached); it starts nothing either way, and attaches nothing itself.
                detach=not stdin,
                stdin_open=stdin,
                # tini as PID 1: it passes docker stop's SIGTERM on to the runner
                # and reaps the orphans of the runner's steps.
                init=True,
                nano_cpus=opts.nano_cpus,
                mem_limit=opts.memory,
                volumes=list(opts.volumes) or None,
                **network,
                **extra,
            )
        except LaunchError:
            raise
        except Exception as exc:
            if isinstance(exc, APIError) and exc.status_code == 409:
                # The name is taken: an earlier try of this very launch whose
                # answer was lost. It never started; remove it, and the retry creates anew.
                self._remove_leftover(name, labels)
            raise launch_error(exc, doing) from exc

    def launch(self, assignment: Assignment) -> WorkerHandle:
        opts = self.options
        container = self._create(f"gantry-{assignment.runner_id}", self.labels(assignment), self._env(assignment))
        try:
            doing = "copy the runner token into the container"
            uid, gid = self._owner(container)
            if not container.put_archive(TOKEN_DIR, _token_archive(assignment.runner_token, uid, gid)):
                raise LaunchError(f"docker: cannot {doing}: the engine refused it", permanent=False)
            doing = f"start the container from {opts.image}"
            container.start()
        except Exception as exc:
            # Never leave a created container behind: it holds the token file.
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
            if isinstance(exc, LaunchError):
                raise
            raise launch_error(exc, doing) from exc
        return self._worker(assignment, container, container.name)

    def _worker(self, assignment: Assignment, container: Any, name: str) -> WorkerHandle:
        """The handle of the container now running ``assignment``'s runner (launched cold or handed a claim)."""
        return WorkerHandle(
            kind=self.kind,
            run_id=assignment.run_id,
            runner_id=assignment.runner_id,
            ident=container.short_id,
            started_at=time.time(),
            meta={"container_id": container.id, "name": name},
        )

    def _remove_leftover(self, name: str, labels: dict[str, str]) -> None:
        with contextlib.suppress(Exception):
            container = self._client().containers.get(name)
            if container.labels == labels and container.status == "created":
                container.remove(force=True, v=True)

    def _owner(self, container: Any) -> tuple[int, int]:
        """The uid and gid the container runs as (its image's ``USER``), so the runner can read its token."""
        user = str(container.attrs.get("Config", {}).get("User") or "")
        name, _, group = user.partition(":")
        if not name:
            return 0, 0
        gid = int(group) if group.isdigit() else None
        if name.isdigit():
            return int(name), gid if gid is not None else int(name)
        # A user by name: look it up in the image's own /etc/passwd.
        stream, _ = container.get_archive("/etc/passwd")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            passwd = member.read().decode(errors="replace") if member else ""
        for line in passwd.splitlines():
            fields = line.split(":")
            if len(fields) >= 4 and fields[0] == name and fields[2].isdigit() and fields[3].isdigit():
                return int(fields[2]), gid if gid is not None else int(fields[3])
        raise LaunchError(f"docker: the image's user {name!r} is not in its /etc/passwd", permanent=True)

    # ------------------------------------------------------------ warm runners

    def start_warm(self) -> WarmWorker:
        warm_id = f"warm-{uuid.uuid4().hex[:12]}"
        labels = {LABEL_MANAGED: "true", LABEL_GROUP: self.group_id, LABEL_WARM: warm_id}
        # StdinOnce: the container's stdin closes when our attach does, after the claim or
        # with this process. The image's entrypoint is the runner; the warm id marks it.
        container = self._create(f"gantry-{warm_id}", labels, self._base_env(), command=["--warm", warm_id],
                                 stdin=True)  # fmt: skip
        doing = "attach to the warm container's stdin"
        try:
            # Attached before the start, as `docker run -i` does: no end-of-file can come first.
            attached = container.attach_socket(params={"stdin": 1, "stream": 1})
            doing = f"start a warm container from {self.options.image}"
            container.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
            raise launch_error(exc, doing) from exc
        self._warm[warm_id] = attached
        return WarmWorker(kind=self.kind, ident=warm_id, started_at=time.time(),
                          meta={"container_id": container.id, "name": container.name})  # fmt: skip

    def assign_warm(self, warm: WarmWorker, assignment: Assignment) -> WorkerHandle:
        attached = self._warm.get(warm.ident)
        if attached is None:
            raise LaunchError(f"warm runner {warm.ident} is not one of this launcher's")
        name = f"gantry-{assignment.runner_id}.run-{assignment.run_id}"
        doing = f"hand warm container {warm.ident} its claim"
        try:
            container = self._client().containers.get(warm.meta["container_id"])
            if container.status != "running":
                raise LaunchError(f"warm runner {warm.ident} has exited ({container.status})")
            # The name before the claim: a coordinator killed between the two still
            # leaves a container its successor re-attaches to as this run's worker.
            container.rename(name)
            doing = f"write the claim to warm container {warm.ident}"
            env = {**self._run_env(assignment), "GANTRY_RUNNER_TOKEN": assignment.runner_token}
            _raw_socket(attached).sendall(json.dumps({"env": env}).encode() + b"\n")
        except LaunchError:
            raise
        except Exception as exc:  # it died, or the engine failed: it read no claim; the pool stops it
            raise launch_error(exc, doing) from exc
        # Closing the attach closes its stdin (StdinOnce): the claim line, then end-of-file.
        del self._warm[warm.ident]
        _close(attached)
        return self._worker(assignment, container, name)

    def warm_alive(self, warm: WarmWorker) -> bool:
        if warm.ident not in self._warm:
            return False
        try:
            return bool(self._client().containers.get(warm.meta["container_id"]).status == "running")
        except NotFound:
            return False
        except Exception as exc:
            # As is_alive: an engine that does not answer is no proof of a death.
            event(log, "docker.unreachable", "cannot look at warm container %s: %s", warm.ident, exc,
                  level=logging.WARNING, worker=warm.ident)  # fmt: skip
            return True

    def stop_warm(self, warm: WarmWorker) -> int | None:
        """Remove the container (it holds nothing: no grace, and nothing to keep); its exit code if it had one."""
        attached = self._warm.pop(warm.ident, None)
        if attached is not None:
            _close(attached)
        try:
            container = self._client().containers.get(warm.meta["container_id"])
            state = container.attrs.get("State", {})
            code = state.get("ExitCode") if container.status == "exited" else None
            container.remove(force=True, v=True)
        except NotFound:
            return None
        except Exception as exc:
            # Left for a later discover, which removes idle warm containers.
            event(log, "worker.remove_failed", "cannot remove warm container %s: %s", warm.ident, _explain(exc),
                  level=logging.WARNING, worker=warm.ident)  # fmt: skip
            return None
        return int(code) if isinstance(code, int) else None

    def warm_last_lines(self, warm: WarmWorker, limit: int = 20) -> list[str]:
        return self._tail(warm.meta["container_id"], limit)

    # ------------------------------------------------------------ discover / alive

    def _handle(self, container: Any) -> WorkerHandle | None:
        """The worker a container is, or None for an idle warm one (it has no run)."""
        labels = container.labels
        run_id, runner_id = labels.get(LABEL_RUN, ""), labels.get(LABEL_RUNNER, "")
        if not run_id:
            taken = _TAKEN_NAME.match(container.name or "")
            if LABEL_WARM not in labels or taken is None:
                return None
            run_id, runner_id = taken.group("run"), taken.group("runner")
        return WorkerHandle(
            kind=self.kind,
            run_id=run_id,
            runner_id=runner_id,
            ident=container.short_id,
            started_at=_parse_started(container.attrs.get("State", {}).get("StartedAt")),
            meta={"container_id": container.id, "name": container.name},
        )

    def discover(self) -> list[WorkerHandle]:
        """This group's containers that still run; those that ended meanwhile are reaped here.

        Raises a transient :class:`LaunchError` when the engine does not answer:
        without the list the coordinator cannot know its own capacity.
        """
        selector = [f"{LABEL_MANAGED}=true", f"{LABEL_GROUP}={self.group_id}"]
        try:
            # ignore_removed: the SDK inspects each listed container; one removed in
            # between (a runner's own exit and reap) is gone, not an engine failure.
            containers = self._client().containers.list(all=True, filters={"label": selector}, ignore_removed=True)
        except Exception as exc:
            raise launch_error(exc, "list the group's containers") from exc
        alive: list[WorkerHandle] = []
        for container in containers:
            handle = self._handle(container)
            if handle is None:
                self._discard_idle_warm(container)
                continue
            if container.status == "created":
                # Created but never started: the coordinator died mid-launch. It
                # holds a token file and will never run: remove it whatever `keep` says.
                with contextlib.suppress(Exception):
                    container.remove(force=True, v=True)
                event(log, "worker.discarded", "removed container %s for run %s: created but never started",
                      handle.ident, handle.run_id, run_id=handle.run_id, worker=handle.ident)  # fmt: skip
            elif container.status in LIVE_STATES:
                alive.append(handle)
            elif not container.name.endswith(REAPED_SUFFIX):
                code = self.reap(handle)
                event(log, "worker.exited", "worker for run %s exited with code %s (while no coordinator watched)",
                      handle.run_id, "unknown" if code is None else code, run_id=handle.run_id,
                      worker=handle.ident, exit_code=code)  # fmt: skip
        return alive

    def _discard_idle_warm(self, container: Any) -> None:
        """Remove a warm container that never took a claim, unless it is one of ours still waiting.

        Its coordinator is gone (its attach closed: it exited 0, or is about to);
        it holds no run and no credential, so nothing is reported.
        """
        warm_id = container.labels.get(LABEL_WARM, "")
        if warm_id in self._warm:
            return
        with contextlib.suppress(Exception):
            container.reload()
            if self._handle(container) is None:  # not renamed meanwhile: still no run's
                container.remove(force=True, v=True)
                event(log, "warm.discarded", "removed idle warm container %s (%s) left by an earlier coordinator",
                      warm_id, container.status, worker=warm_id)  # fmt: skip

    def is_alive(self, handle: WorkerHandle) -> bool:
        try:
            return self._get(handle).status in LIVE_STATES
        except NotFound:
            return False  # removed behind our back: nothing runs
        except Exception as exc:
            # The engine did not answer: believe the worker still runs rather
            # than reap it blind; the next look will tell.
            event(log, "docker.unreachable", "cannot look at container %s: %s", handle.ident, exc,
                  level=logging.WARNING, run_id=handle.run_id, worker=handle.ident)  # fmt: skip
            return True

    def last_lines(self, handle: WorkerHandle, limit: int = 20) -> list[str]:
        """The tail of the container's output (the runner's own log lines), from the engine's log."""
        return self._tail(handle.meta["container_id"], limit)

    def _tail(self, container_id: str, limit: int) -> list[str]:
        try:
            data = self._client().containers.get(container_id).logs(stdout=True, stderr=True, tail=limit)
        except Exception:
            return []  # gone, or a log driver the engine cannot read back
        return bytes(data).decode(errors="replace").splitlines()[-limit:]

    # ------------------------------------------------------------ terminate / reap

    def terminate(self, handle: WorkerHandle, grace: float = 10.0) -> None:
        """``docker stop``: the engine sends SIGTERM (the runner stops its step) and SIGKILL after ``grace``."""
        try:
            self._get(handle).stop(timeout=max(0, math.ceil(grace)))
        except NotFound:
            return
        except Exception as exc:
            event(log, "worker.terminate_failed", "cannot stop container %s: %s", handle.ident, _explain(exc),
                  level=logging.WARNING, run_id=handle.run_id, worker=handle.ident)  # fmt: skip

    def reap(self, handle: WorkerHandle) -> int | None:
        """The exit code from the container's state; then the container goes (or is renamed, with ``keep``)."""
        try:
            container = self._get(handle)
        except NotFound:
            return None
        except Exception as exc:
            # Left for a later discover (it finds the exited container and reaps it then).
            event(log, "docker.unreachable", "cannot reap container %s: %s", handle.ident, exc,
                  level=logging.WARNING, run_id=handle.run_id, worker=handle.ident)  # fmt: skip
            return None
        state = container.attrs.get("State", {})
        code = state.get("ExitCode")
        if state.get("OOMKilled"):
            event(log, "worker.oom_killed", "container %s for run %s was killed for lack of memory",
                  handle.ident, handle.run_id, level=logging.WARNING, run_id=handle.run_id,
                  worker=handle.ident)  # fmt: skip
        try:
            if self.options.keep:
                if not container.name.endswith(REAPED_SUFFIX):
                    container.rename(container.name + REAPED_SUFFIX)
            else:
                container.remove(v=True, force=True)
        except NotFound:
            pass
        except Exception as exc:
            event(log, "worker.remove_failed", "cannot remove container %s: %s", handle.ident, _explain(exc),
                  level=logging.WARNING, run_id=handle.run_id, worker=handle.ident)  # fmt: skip
        return int(code) if isinstance(code, int) else None


def _raw_socket(attached: Any) -> socket.socket:
    """The socket under what the SDK's ``attach_socket`` answers (a ``SocketIO`` over a Unix or TCP socket)."""
    raw = getattr(attached, "_sock", attached)
    if not isinstance(raw, socket.socket):
        raise LaunchError(f"docker: an attach gave {type(attached).__name__}, not a socket", permanent=True)
    return raw


def _close(attached: Any) -> None:
    """End the attach: the engine sees end-of-file on it and closes the container's stdin (StdinOnce)."""
    with contextlib.suppress(Exception):
        raw = _raw_socket(attached)
        # shutdown, not only close: the SDK's response object holds the socket open too.
        raw.shutdown(socket.SHUT_RDWR)
        raw.close()
    with contextlib.suppress(Exception):
        attached.close()
