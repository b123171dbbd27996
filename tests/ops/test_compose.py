"""docker-compose.yml loses nothing (issue 23): read by Compose itself, then checked for what makes that true.

``docker-compose config`` (Debian's docker-compose, the one CI installs)
validates the file and prints it resolved; ``docker compose config`` (the v2
plugin) does the same when the machine has it. The resolved file must name the
log bucket and create it before anything writes logs, keep every stateful
path on a named volume, give each long-running service a healthcheck that the
services after it wait on, and keep the coordinator out of a plain ``up``.
Without docker-compose the test is skipped with the reason, and fails under
``CI=true``, where a skip would hide a missing tool.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"

# Where each stateful service keeps what must outlive its container.
STATE = {
    "postgres": "/var/lib/postgresql/data",  # postgres:16's PGDATA
    "redis": "/data",  # the append-only file (redis:7's working folder)
    "minio": "/data",  # the bucket: sealed logs
    "web": "/data",  # GANTRY_DATA_DIR (the image's): the local log folder if the bucket is ever unset
    "worker": "/data",
    "beat": "/data",  # the schedule file
    "coordinator": "/data",  # its --state-dir under it: re-attaching to runs in progress
}
# What writes or reads sealed logs, and so must see the bucket.
USES_LOGS = ("web", "worker", "beat")


def _implementations() -> list[list[str]]:
    found: list[list[str]] = []
    v1 = shutil.which("docker-compose")
    if v1 is None:
        problem = "docker-compose is not installed (Debian: apt-get install docker-compose)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI needs docker-compose for this test: {problem}", pytrace=False)
        pytest.skip(problem)
    found.append([v1])
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        found.append([docker, "compose"])
    return found


def _config(command: list[str], compose_file: Path, env_file: Path) -> subprocess.CompletedProcess[str]:
    # Compose's own defaults only: nothing from the shell or a developer's .env.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GANTRY_", "COMPOSE_", "DOCKER_GID"))}
    argv = [*command, "--env-file", str(env_file), "-f", str(compose_file), "config"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The file as each Compose on the machine resolves it; each must accept it."""
    env_file = tmp_path_factory.mktemp("compose") / "empty.env"
    env_file.write_text("")
    answers = []
    for command in _implementations():
        result = _config(command, COMPOSE_FILE, env_file)
        assert result.returncode == 0, f"{' '.join(command)} config: {result.stderr}"
        answers.append(yaml.safe_load(result.stdout))
    return answers


def _volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source of the service's named volumes (v1 prints ``src:dst:mode``, v2 the long form)."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            source, target = entry.split(":")[:2]
            if not source.startswith(("/", ".")):
                mounts[target] = source
        elif entry.get("type") == "volume":
            mounts[entry["target"]] = entry["source"]
    return mounts


def _long_running(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # One-shots say `restart: "no"`; the runner image is only built (its `build` profile).
    return {
        name: service
        for name, service in spec["services"].items()
        if service.get("restart", "no") != "no" and "build" not in service.get("profiles", [])
    }


def test_compose_itself_rejects_a_broken_file(tmp_path: Path) -> None:
    # The control: `config` really validates, so the acceptance in `resolved` means something.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("condition: service_healthy", "condition: service_ready", 1))
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    for command in _implementations():
        result = _config(command, broken, env_file)
        assert result.returncode != 0, f"{' '.join(command)} accepted condition: service_ready"


def test_sealed_logs_go_to_a_bucket_a_one_shot_creates_first(resolved: list[dict[str, Any]]) -> None:
    for spec in resolved:
        services = spec["services"]
        bucket = services["createbucket"]["environment"]["GANTRY_S3_BUCKET"]
        assert bucket
        assert services["createbucket"]["command"] == ["python", "manage.py", "create_log_bucket"]
        assert services["createbucket"]["restart"] == "no"
        assert services["createbucket"]["depends_on"]["minio"]["condition"] == "service_healthy"
        for name in USES_LOGS:
            env = services[name]["environment"]
            assert env["GANTRY_S3_BUCKET"] == bucket, name
            assert env["AWS_ENDPOINT_URL"] == "http://minio:9000", name
            depends = services[name]["depends_on"]
            assert depends["createbucket"]["condition"] == "service_completed_successfully", name
            assert depends["migrate"]["condition"] == "service_completed_successfully", name


def test_every_stateful_path_is_on_a_named_volume(resolved: list[dict[str, Any]]) -> None:
    for spec in resolved:
        services = spec["services"]
        for name, path in STATE.items():
            mounts = _volume_mounts(services[name])
            assert path in mounts, f"{name}: {path} is not on a named volume ({services[name].get('volumes')})"
            assert mounts[path] in spec["volumes"], name
        # What lives under those folders really does.
        assert services["minio"]["command"][:2] == ["server", "/data"]
        assert "--appendonly" in services["redis"]["command"]
        beat = services["beat"]["command"]
        assert beat[beat.index("--schedule") + 1].startswith("/data/")
        state_dir = next(a for a in services["coordinator"]["command"] if a.startswith("--state-dir="))
        assert state_dir.startswith("--state-dir=/data/")
        # Two different services never share a volume by accident: only web, worker and beat share /data.
        owners: dict[str, set[str]] = {}
        for name in STATE:
            owners.setdefault(_volume_mounts(services[name])[STATE[name]], set()).add(name)
        shared = {volume: names for volume, names in owners.items() if len(names) > 1}
        assert list(shared.values()) == [set(USES_LOGS)]


def test_every_long_running_service_has_a_healthcheck_the_others_wait_on(resolved: list[dict[str, Any]]) -> None:
    for spec in resolved:
        long_running = _long_running(spec)
        assert set(long_running) == {"postgres", "redis", "minio", "web", "worker", "beat", "coordinator"}
        for name, service in long_running.items():
            test = service.get("healthcheck", {}).get("test")
            assert test, f"{name} has no healthcheck"
            assert not service["healthcheck"].get("disable"), name
            assert test[0] in ("CMD", "CMD-SHELL"), f"{name}: {test}"
            assert " ".join(test[1:]).strip() not in ("true", "exit 0", ":"), f"{name}'s healthcheck cannot fail"
        # The coordinator's check asks the address its health server listens on (docs/runners.md).
        coordinator = long_running["coordinator"]
        port = coordinator["environment"]["GANTRY_COORDINATOR_HEALTH_ADDR"].rpartition(":")[2]
        assert f"http://127.0.0.1:{port}/healthz" in " ".join(coordinator["healthcheck"]["test"])
        for name, service in spec["services"].items():
            for needed, how in service.get("depends_on", {}).items():
                wanted = "service_healthy" if needed in long_running else "service_completed_successfully"
                assert how["condition"] == wanted, f"{name} -> {needed}"


def test_a_plain_up_leaves_the_coordinator_out_and_a_missing_token_does_not_loop(
    resolved: list[dict[str, Any]],
) -> None:
    for spec in resolved:
        coordinator = spec["services"]["coordinator"]
        assert coordinator.get("profiles") == ["coordinator"], "a plain `up` would start the coordinator"
        policy, _, retries = coordinator["restart"].partition(":")
        assert policy == "on-failure"
        assert retries.isdigit()
        assert 0 < int(retries) <= 5
        # Everything else starts with a plain `up`.
        in_profiles = {name for name, service in spec["services"].items() if service.get("profiles")}
        assert in_profiles == {"coordinator", "runner-image"}
