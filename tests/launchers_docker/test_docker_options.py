"""The Docker launcher without an engine: its options, how it names failures, and an engine that is down.

"Down" is real: the SDK is pointed (``DOCKER_HOST``) at a loopback port where
nothing listens, so every call meets a refused connection.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
from docker.errors import APIError, ImageNotFound

import launchers
from launchers.base import Assignment, LaunchError, WorkerHandle
from launchers.docker import DockerLauncher, DockerOptions, launch_error
from runners.client import GantryClient
from runners.coordinator import Coordinator, Settings
from tests.e2e.conftest import wait_until
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def parse(**options: str) -> DockerOptions:
    return DockerOptions.parse(options)


def test_it_is_the_docker_kind_and_builds_from_the_coordinators_options(tmp_path: Path) -> None:
    made = launchers.create("docker", state_dir=tmp_path, options={"image": "gantry-runner:local"})
    assert isinstance(made, DockerLauncher)
    assert "docker" in launchers.kinds()


def test_every_option_is_read() -> None:
    opts = parse(
        image="gantry-runner:local",
        network="gantry_default",
        server_url="http://web:8000/",
        pull="always",
        cpus="1.5",
        memory="512m",
        env="HTTP_PROXY, NO_PROXY",
        volume="/srv/cache:/cache:ro,gantry-work:/work",
        keep="yes",
    )
    assert opts == DockerOptions(
        image="gantry-runner:local",
        network="gantry_default",
        server_url="http://web:8000",
        pull="always",
        nano_cpus=1_500_000_000,
        memory=512 * 1024**2,
        env=("HTTP_PROXY", "NO_PROXY"),
        volumes=("/srv/cache:/cache:ro", "gantry-work:/work"),
        keep=True,
    )
    assert parse(image="x") == DockerOptions(image="x", pull="missing", keep=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"image": "x", "imgae": "y"}, "unknown docker launcher options: imgae"),
        ({}, "needs --launcher-option image=IMAGE"),
        ({"image": "  "}, "needs --launcher-option image=IMAGE"),
        ({"image": "x", "pull": "sometimes"}, "pull='sometimes': one of never, missing, always"),
        ({"image": "x", "cpus": "0"}, "cpus='0'"),
        ({"image": "x", "cpus": "many"}, "cpus='many'"),
        ({"image": "x", "memory": "lots"}, "memory='lots'"),
        ({"image": "x", "memory": "1t"}, "memory='1t'"),
        ({"image": "x", "env": "OK,NOT-A-NAME"}, "'NOT-A-NAME' is not an environment variable name"),
        ({"image": "x", "env": "GANTRY_GROUP_TOKEN"}, "GANTRY_GROUP_TOKEN is a Gantry credential"),
        ({"image": "x", "volume": "/only-one-part"}, "volume='/only-one-part'"),
        ({"image": "x", "volume": "/a:relative"}, "volume='/a:relative'"),
        ({"image": "x", "volume": "/a:/b:rx"}, "the mode is ro or rw, not 'rx'"),
        ({"image": "x", "keep": "maybe"}, "keep='maybe': true or false"),
    ],
)
def test_bad_options_are_refused_with_the_reason(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="docker launcher") as caught:
        DockerOptions.parse(options)
    assert message in str(caught.value)


def coordinator_main(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The coordinator as an operator starts it; it exits on its options before any request is sent."""
    return subprocess.run(
        [
            sys.executable, "-m", "runners.coordinator", "--server", f"http://127.0.0.1:{free_port()}",
            "--token", "not-used", "--state-dir", str(tmp_path / "state"), "--launcher", "docker", *args,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--launcher-option", "image=x", "--launcher-option", "nope=1"], "unknown docker launcher options: nope"),
        ([], "the docker launcher needs --launcher-option image=IMAGE"),
    ],
)
def test_the_coordinator_exits_2_on_bad_docker_options(tmp_path: Path, args: list[str], message: str) -> None:
    result = coordinator_main(tmp_path, *args)
    assert result.returncode == 2
    [line] = [json.loads(line) for line in result.stderr.splitlines() if "coordinator.bad_launcher" in line]
    assert message in line["msg"]


def test_the_coordinator_refuses_an_option_given_twice(tmp_path: Path) -> None:
    result = coordinator_main(tmp_path, "--launcher-option", "volume=/a:/a", "--launcher-option", "volume=/b:/b")
    assert result.returncode == 2
    assert "--launcher-option volume is given twice" in result.stderr


def test_docker_failures_are_permanent_only_when_trying_again_cannot_help() -> None:
    def api_error(cls: type[APIError], status: int, explanation: str) -> APIError:
        response = requests.Response()
        response.status_code = status
        return cls(f"{status} error", response=response, explanation=explanation)

    missing = launch_error(api_error(ImageNotFound, 404, "No such image: x:y"), "create a container from x:y")
    assert (missing.permanent, missing.message) == (
        True,
        "docker: cannot create a container from x:y: No such image: x:y",
    )
    assert launch_error(api_error(APIError, 403, "pull access denied"), "pull x").permanent is True
    assert launch_error(api_error(APIError, 400, "invalid mount config"), "create").permanent is True
    assert launch_error(api_error(APIError, 409, "name in use"), "create").permanent is False
    assert launch_error(api_error(APIError, 500, "no space left on device"), "create").permanent is False
    refused = launch_error(requests.exceptions.ConnectionError("refused"), "pull x")
    assert refused.permanent is False
    assert "the Docker engine is unreachable" in refused.message


@pytest.fixture
def engine_down(monkeypatch: pytest.MonkeyPatch) -> str:
    host = f"tcp://127.0.0.1:{free_port()}"
    monkeypatch.setenv("DOCKER_HOST", host)
    return host


def test_an_engine_that_does_not_answer_is_a_transient_failure(engine_down: str) -> None:
    docker_launcher = DockerLauncher(parse(image="gantry-runner:local"))
    job = Assignment(server="http://127.0.0.1:1", run_id="r", runner_id="x", runner_token="secret-token")
    with pytest.raises(LaunchError) as launched:
        docker_launcher.launch(job)
    assert launched.value.permanent is False
    assert "the Docker engine is unreachable" in launched.value.message
    assert "secret-token" not in launched.value.message
    with pytest.raises(LaunchError) as discovered:
        docker_launcher.discover()
    assert discovered.value.permanent is False

    handle = WorkerHandle(kind="docker", run_id="r", runner_id="x", ident="c", started_at=0, meta={"container_id": "c"})
    assert docker_launcher.is_alive(handle) is True  # unknown is not dead: never reaped blind
    assert docker_launcher.reap(handle) is None
    assert docker_launcher.last_lines(handle) == []
    docker_launcher.terminate(handle, grace=0)  # logged, not raised


def test_the_coordinator_waits_for_an_engine_that_does_not_answer_yet(
    engine_down: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    quick = Settings(backoff_base=0.01, backoff_cap=0.05)
    # The client is never used: discover comes before the first poll, and the test stops it there.
    client = GantryClient(f"http://127.0.0.1:{free_port()}", "a.b.c", timeout=5)
    coordinator = Coordinator(client, DockerLauncher(parse(image="gantry-runner:local")), quick)
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(coordinator.run()), daemon=True)
    thread.start()

    def failures() -> int:
        return sum(getattr(r, "event", None) == "discover.failed" for r in caplog.records)

    wait_until(lambda: failures() >= 2, 30, "discover to be retried")
    coordinator.stop()
    thread.join(30)
    assert outcome == [0]
    assert coordinator.claimed == 0
