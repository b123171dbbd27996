"""docker-compose.yml's coordinator: its command is one the coordinator and the Docker launcher accept.

Read as Compose reads it (``${VAR:-default}`` takes the default), then parsed
by the coordinator's own argument parser and the launcher's option parser: a
typo in an option name, or a network the runner containers would not share
with the web service, fails here rather than in an operator's restart loop.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from launchers.docker import DockerOptions
from runners.coordinator import parse_args

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    text = (ROOT / "docker-compose.yml").read_text()
    text = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)  # Compose's defaults, as with nothing in .env
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def test_the_coordinator_service_runs_the_docker_launcher_on_the_projects_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = compose()
    service = spec["services"]["coordinator"]
    argv = service["command"]
    assert argv[:3] == ["python", "-m", "runners.coordinator"]
    monkeypatch.setenv("GANTRY_GROUP_TOKEN", "a.b.c")  # what .env gives it
    args = parse_args(argv[3:])
    assert args.launcher == "docker"
    options = DockerOptions.parse(args.options)

    # Runner containers join the network the web service is on, and reach it by its service name.
    assert options.network == spec["networks"]["default"]["name"]
    assert options.server_url == args.server == "http://web:8000"
    assert "web" in spec["x-gantry-env"]["GANTRY_ALLOWED_HOSTS"].split(",")
    assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]
    assert args.state_dir.startswith("/data/")  # the image's one folder its user may write
    # The image it runs is the one the runner-image service builds from runners/Dockerfile.
    builder = spec["services"]["runner-image"]
    assert options.image == builder["image"]
    assert (ROOT / builder["build"]["context"] / builder["build"]["dockerfile"]).is_file()
    assert "GANTRY_GROUP_TOKEN" in service["environment"]
