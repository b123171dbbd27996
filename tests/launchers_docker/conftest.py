"""Fixtures for the Docker launcher's tests, against the machine's real Docker engine.

Tests marked ``docker`` need an engine that answers and the runner image
(``gantry-runner:local``, or ``GANTRY_RUNNER_IMAGE``): ``bash .ci/docker-setup``
makes both. Without them such a test is skipped with the reason (shown by
pytest's ``-ra`` summary), and fails under ``CI=true``, where a skip would hide
that the engine never came up.

The end-to-end tests reuse tests/e2e's real processes (a gunicorn server on a
database of its own, moto's S3, coordinators as subprocesses) with the
coordinator switched to ``--launcher docker``: containers use the host's
network (``network=host``), so the runner inside reaches the server and S3 on
127.0.0.1 and no traffic leaves the machine. Every container a test's groups
made is removed afterwards, whatever the outcome (label filter).
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import DockerException, ImageNotFound

from launchers.docker import LABEL_GROUP, LABEL_MANAGED, LABEL_RUN
from tests.e2e import conftest as e2e
from tests.e2e.conftest import Coordinator, Lab, Server, new_lab

# tests/e2e's fixtures and its report hook (which lets a fixture see a failed test), for these tests too.
server = e2e.server
moto_s3 = e2e.moto_s3
lab = e2e.lab
pytest_runtest_makereport = e2e.pytest_runtest_makereport

RUNNER_IMAGE = os.environ.get("GANTRY_RUNNER_IMAGE", "gantry-runner:local")
_engine: dict[str, str | None] = {}


def _engine_problem() -> str | None:
    """Why the docker tests cannot run here (None: they can). Asked once per session."""
    if "problem" not in _engine:
        problem = None
        try:
            client = docker.from_env(timeout=10)
        except DockerException as exc:
            problem = f"no Docker engine answers ({exc})"
        else:
            try:
                client.images.get(RUNNER_IMAGE)
            except ImageNotFound:
                problem = f"the runner image {RUNNER_IMAGE} is missing (python3 dev.py runner-image)"
            except DockerException as exc:
                problem = f"the Docker engine fails ({exc})"
            finally:
                client.close()
        _engine["problem"] = problem and f"{problem}; `bash .ci/docker-setup` sets Docker up"
    return _engine["problem"]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is None:
        return
    problem = _engine_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI needs Docker for this test: {problem}", pytrace=False)
    pytest.skip(f"needs Docker: {problem}")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    client = docker.from_env()
    yield client
    client.close()


def remove_containers(client: Any, group_ids: list[str]) -> None:
    """Every container of these groups, running or not: what a test leaves is never left for the next."""
    for group_id in group_ids:
        selector = [f"{LABEL_MANAGED}=true", f"{LABEL_GROUP}={group_id}"]
        for container in client.containers.list(all=True, filters={"label": selector}, ignore_removed=True):
            with contextlib.suppress(DockerException):
                container.remove(force=True, v=True)


@pytest.fixture(scope="session")
def unique_group_ids(server: Server) -> None:
    """Start this server's runner-group ids at a random point.

    The labels name a group by its id, and every test database counts from 1,
    so two test sessions on one engine (this machine is shared) would each own
    a "group 1". A random start keeps their containers apart.
    """
    import psycopg

    with psycopg.connect(server.env["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "SELECT setval(pg_get_serial_sequence('runner_group', 'id'), %s)", [random.randint(10**6, 2 * 10**9)]
        )


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A host folder the containers see as /shared (writable by the runner's uid): go files, markers."""
    path = tmp_path / "shared"
    path.mkdir()
    path.chmod(0o777)
    return path


@dataclass
class DockerLab:
    """A test's groups and their coordinators, all on the Docker launcher."""

    lab: Lab
    client: Any
    shared: Path
    labs: list[Lab] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.labs.append(self.lab)

    def other_group(self, suffix: str) -> Lab:
        """A second runner group (and stack) on the same server, with a folder of its own."""
        tmp = self.lab.tmp / suffix
        tmp.mkdir()
        other = new_lab(self.lab.server, f"{self.lab.name[:40]}-{suffix}", tmp)
        self.labs.append(other)
        return other

    def coordinator(
        self, *options: str, lab: Lab | None = None, state_dir: Path | None = None, args: Sequence[str] = ()
    ) -> Coordinator:
        """A coordinator on the Docker launcher with the runner image, host networking and /shared
        (``options``: launcher options KEY=VALUE; ``args``: more of the coordinator's own flags)."""
        chosen = {"image": RUNNER_IMAGE, "network": "host", "pull": "never", "volume": f"{self.shared}:/shared"}
        for option in options:
            key, _, value = option.partition("=")
            chosen[key] = value
        argv = ["--launcher", "docker", *args]
        for key, value in chosen.items():
            argv += ["--launcher-option", f"{key}={value}"]
        return (lab or self.lab).coordinator(*argv, state_dir=state_dir)

    def containers(self, *, run_id: str | None = None, group_id: int | None = None) -> list[Any]:
        selector = [f"{LABEL_MANAGED}=true", f"{LABEL_GROUP}={group_id or self.lab.group_id}"]
        if run_id is not None:
            selector.append(f"{LABEL_RUN}={run_id}")
        # A container removed between the SDK's list and its inspect of it is gone, not an error.
        return list(self.client.containers.list(all=True, filters={"label": selector}, ignore_removed=True))

    def inspect(self, container_id: str) -> str:
        """``docker inspect``, the operator's own command, as its raw JSON text."""
        result = subprocess.run(["docker", "inspect", container_id], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout


@pytest.fixture
def dlab(
    lab: Lab, docker_client: Any, shared: Path, unique_group_ids: None, request: pytest.FixtureRequest
) -> Iterator[DockerLab]:
    dl = DockerLab(lab, docker_client, shared)
    try:
        yield dl
    finally:
        failed = getattr(request.node, "rep_call", None)
        # The coordinators first (so none launches anew), then every container of the test's groups.
        for each in dl.labs:
            for coordinator in each.coordinators:
                if coordinator.proc.poll() is None:
                    coordinator.proc.kill()
                    coordinator.proc.wait()
                if failed is not None and failed.failed and each is not lab:
                    print(f"\n--- {coordinator.log} ---\n{coordinator.log.read_text(errors='replace')[-6000:]}")
            if failed is not None and failed.failed:
                for container in dl.containers(group_id=each.group_id):
                    output = container.logs(tail=40).decode(errors="replace")
                    print(f"\n--- container {container.name} ({container.status}) ---\n{output}")
        remove_containers(docker_client, [str(each.group_id) for each in dl.labs])
