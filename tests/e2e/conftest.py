"""End to end with real processes: a gunicorn server, coordinators, the ephemeral runners they launch.

The server runs as a subprocess, so it cannot see pytest-django's test
database (that lives in the test process's transactions). It gets a database
of its own instead: ``gantry_e2e_<random>`` on the same PostgreSQL server as
the test settings (the machine's, or the embedded one), created and migrated
once per session by ``manage.py migrate`` and dropped at the end. Redis is the
test settings' Redis (live-log keys are per run id, so nothing collides), and
the dispatch throttle is switched off for this server. S3 is moto's threaded
server in this process, with versioning on so a test can count the PUTs of
each chunk key.

Everything is set up through the public surface: ``manage.py`` for bootstrap
(migrate, createsuperuser, drf_create_token), the REST API for the rest. Each
test gets its own runner group (unique labels) and stack, so coordinators of
different tests never take each other's runs.

Waiting is always a bounded poll of an observable condition; the bounds are
generous because two shared cores also serve other engineers' test runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runners.client import ApiError, GantryClient
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "gantry-e2e-logs"
TERMINAL = {"succeeded", "failure", "cancelled", "discarded", "startup_timeout"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(interval)


def venv_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GANTRY_TEST_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# ---------------------------------------------------------------- the server


@dataclass
class Server:
    url: str
    env: dict[str, str]
    root_token: str
    org: str
    s3: Any  # boto3 client on the moto server
    log: Path
    tmp: Path

    def api(self) -> GantryClient:
        return GantryClient(self.url, self.root_token, scheme="Token", timeout=60)

    def manage(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout


def _admin_url(database_url: str, name: str) -> str:
    return urllib.parse.urlsplit(database_url)._replace(path=f"/{name}").geturl()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[tuple[str, Any]]:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    # Its request lines would drown the test output.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=BUCKET)
    # Every PUT of a key makes a version: "uploaded exactly once" is one version per chunk key.
    client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    try:
        yield endpoint, client
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, moto_s3: tuple[str, Any]) -> Iterator[Server]:
    import psycopg
    from django.conf import settings
    from psycopg import sql

    tmp = tmp_path_factory.mktemp("e2e")
    base_url: str = settings.DATABASE_URL
    name = f"gantry_e2e_{secrets.token_hex(4)}"
    admin = _admin_url(base_url, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    endpoint, s3 = moto_s3
    env = venv_env(
        DATABASE_URL=_admin_url(base_url, name),
        REDIS_URL=settings.REDIS_URL,
        DJANGO_SETTINGS_MODULE="gantry.settings",
        GANTRY_SECRET_KEY=secrets.token_urlsafe(50),
        GANTRY_DATA_DIR=str(tmp / "data"),
        # The throttle is issue 5's subject, not this suite's (and org ids repeat across test databases).
        GANTRY_RATE_LIMIT_ENABLED="false",
        # RunContext timings: quick status polls and live ticks keep the tests short.
        GANTRY_STATUS_INTERVAL="1",
        GANTRY_LIVE_LOG_INTERVAL="1",
        GANTRY_S3_BUCKET=BUCKET,
        GANTRY_S3_ENDPOINT_URL=endpoint,
        GANTRY_S3_REGION="us-east-1",
        GANTRY_S3_ADDRESSING_STYLE="path",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        GANTRY_LOG_LEVEL="WARNING",
    )
    env.pop("GANTRY_LOG_DIR", None)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "server.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True,
            capture_output=True, timeout=300,
        )  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "gunicorn", "gantry.wsgi", "-b", f"127.0.0.1:{port}",
                    "--worker-class", "gthread", "--threads", "16", "--no-control-socket",
                    "--graceful-timeout", "5",
                ],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0,
            )  # fmt: skip

        def serving() -> bool:
            assert proc is not None
            assert proc.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return False

        wait_until(serving, 60, "the server to listen")
        partial = Server(url, env, "", "e2e", s3, log, tmp)
        partial.manage(
            "shell", "-c",
            "from django.contrib.auth.models import User; "
            "User.objects.create_superuser('root', 'root@example.com', 'pw-root-e2e')",
        )  # fmt: skip
        out = partial.manage("drf_create_token", "root")
        token = out.split("token ", 1)[1].split(" ", 1)[0]
        partial.root_token = token
        partial.api().request("POST", "/api/v1/orgs", body={"slug": "e2e", "name": "End to end"})
        wait_until(lambda: _ready(url), 60, "/readyz")
        yield partial
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _ready(url: str) -> bool:
    try:
        return GantryClient(url, timeout=5).request("GET", "/readyz").status == 200
    except ApiError:
        return False


# ---------------------------------------------------------------- one test's group, stack and coordinators


@dataclass
class Coordinator:
    proc: subprocess.Popen[bytes]
    log: Path
    state_dir: Path

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines() if self.log.exists() else []:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def named(self, name: str, run_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == name and (run_id is None or e.get("run_id") == run_id)]


@dataclass
class Lab:
    server: Server
    name: str
    group_id: int
    group_token: str
    stack_id: int
    tmp: Path
    coordinators: list[Coordinator] = field(default_factory=list)

    @property
    def api(self) -> GantryClient:
        return self.server.api()

    def coordinator(self, *args: str, state_dir: Path | None = None) -> Coordinator:
        state = state_dir or self.tmp / "state"
        log = self.tmp / f"coordinator-{len(self.coordinators)}.log"
        env = venv_env(GANTRY_GROUP_TOKEN=self.group_token, GANTRY_STOP_GRACE="3")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "runners.coordinator", "--server", self.server.url,
                    "--launcher", "local", "--state-dir", str(state), "--max-parallel", "4", "--wait", "5",
                    "--backoff-cap", "2", *args,
                ],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        coordinator = Coordinator(proc, log, state)
        self.coordinators.append(coordinator)
        wait_until(lambda: coordinator.named("coordinator.started") or proc.poll() is not None, 60,
                   "the coordinator to start")  # fmt: skip
        assert proc.poll() is None, log.read_text()
        return coordinator

    def deploy(self, steps: list[dict[str, str]], **spec: Any) -> str:
        body = {"steps": steps, **spec}
        deployment = self.api.create_deployment(self.stack_id, spec=body)
        return str(deployment["run"]["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        return self.api.get_run(run_id)

    def wait_status(self, run_id: str, statuses: set[str], timeout: float = 120) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            run = self.run(run_id)
            return run if run["status"] in statuses else None

        result: dict[str, Any] = wait_until(reached, timeout, f"run {run_id} to be {'/'.join(sorted(statuses))}", 0.25)
        return result

    def wait_terminal(self, run_id: str, timeout: float = 120) -> dict[str, Any]:
        return self.wait_status(run_id, TERMINAL, timeout)

    def read_log(self, run_id: str) -> tuple[str, int]:
        """The whole log through the API (following next_offset); answers (text, pages)."""
        text, offset, pages = [], 0, 0
        while True:
            page = self.api.run_logs(run_id, offset=offset)
            text.append(page["text"])
            offset = page["next_offset"]
            pages += 1
            if page["final"]:  # nothing more will come (complete, or final with a marker of what was lost)
                return "".join(text), pages
            assert pages < 100_000, "the log never ended"

    def log_so_far(self, run_id: str) -> str:
        text, offset = [], 0
        while True:
            page = self.api.run_logs(run_id, offset=offset)
            text.append(page["text"])
            if page["final"] or page["next_offset"] == offset:
                return "".join(text)
            offset = page["next_offset"]


def _kill_workers(state_dir: Path) -> None:
    """Whatever runners a test left behind (by design or by failure) go, with their steps."""
    for record in (state_dir / "workers").glob("*.json"):
        try:
            pid = int(json.loads(record.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            continue
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and b"runners.ephemeral" in cmdline.read_bytes():
            with_session = [
                int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _sid(int(p.name)) == pid
            ]
            for member in with_session:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(member, signal.SIGKILL)


def _sid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def new_lab(server: Server, name: str, tmp: Path) -> Lab:
    """A runner group of its own (labels ``e2e: <name>``) and a stack that selects it."""
    labels = {"e2e": name}
    api = server.api()
    group = api.request(
        "POST", f"/api/v1/orgs/{server.org}/runner-groups", body={"name": name, "labels": labels}
    ).json()
    stack = api.request(
        "POST",
        f"/api/v1/orgs/{server.org}/stacks",
        body={
            "name": name,
            "labels": {"gantry:runner-group:e2e": name},
            "spec": {"steps": [{"name": "hello", "run": "echo hello"}]},
        },
    ).json()
    return Lab(server, name, int(group["id"]), str(group["token"]), int(stack["id"]), tmp)


@pytest.fixture
def lab(server: Server, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lab]:
    lab = new_lab(server, request.node.name.replace("test_", "")[:50], tmp_path)
    yield lab
    failed = getattr(request.node, "rep_call", None)
    for coordinator in lab.coordinators:
        if coordinator.proc.poll() is None:
            coordinator.proc.terminate()
            try:
                coordinator.proc.wait(20)
            except subprocess.TimeoutExpired:
                coordinator.proc.kill()
                coordinator.proc.wait()
        if failed is not None and failed.failed:
            print(f"\n--- {coordinator.log} ---\n{coordinator.log.read_text(errors='replace')[-6000:]}")
            for worker_log in sorted((coordinator.state_dir / "logs").glob("*.log")):
                print(f"\n--- {worker_log} ---\n{worker_log.read_text(errors='replace')[-4000:]}")
        _kill_workers(coordinator.state_dir)
    if failed is not None and failed.failed:
        print(f"\n--- server log ---\n{server.log.read_text(errors='replace')[-4000:]}")
