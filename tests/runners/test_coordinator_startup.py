"""The coordinator fails fast and can be probed (docs/runners.md, "Exit codes" and "Health and metrics").

Usage errors exit 2 with one line and no traceback; a malformed token exits 3
before any request; at start one call tells a refused token or a URL that is
not Gantry (exit 3) from a server that is not up yet (waited for, with
``/healthz`` saying 503 once the bound has passed). ``--health-addr`` serves
``/healthz`` and ``/metrics`` while the coordinator polls a real server.

The programs are real subprocesses (``python -m runners.coordinator``) against
``live_server``; waits are bounded polls of what can be observed, never timed
assertions.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gantry.core import services
from launchers.fake import FakeLauncher
from runners.client import GantryClient
from runners.coordinator import EXIT_REFUSED, EXIT_USAGE, Coordinator, Settings
from runners.health import CoordinatorMetrics, HealthServer, judge
from tests.ports import free_port
from tests.required_tools import require_tool
from tests.runners.conftest import ROOT, Site, wait_until

QUICK = Settings(max_parallel=2, wait=1, backoff_base=0.01, backoff_cap=0.05, launch_retry_delay=0, idle_pause=0.01)
METRIC_NAMES = (
    "gantry_coordinator_workers_running",
    "gantry_coordinator_workers_warm",
    "gantry_coordinator_launches_total",
    "gantry_coordinator_launch_failures_total",
    "gantry_coordinator_polls_total",
    "gantry_coordinator_last_contact_timestamp_seconds",
)


def _env(tmp_path: Path, token: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "GANTRY_GROUP_TOKEN": token,
        "GANTRY_STATE_DIR": str(tmp_path / "state"),
    }


def run(tmp_path: Path, *args: str, token: str = "x.y.z") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runners.coordinator", *args],
        cwd=ROOT,
        env=_env(tmp_path, token),
        capture_output=True,
        text=True,
        timeout=60,
    )


def start(tmp_path: Path, *args: str, token: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runners.coordinator", *args],
        cwd=ROOT,
        env=_env(tmp_path, token),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'HS256', 'typ': 'JWT', 'kid': 'default'})}.{part(claims)}.c2lnbmF0dXJl"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# ---------------------------------------------------------------- usage errors: exit 2, one line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--server", "127.0.0.1:8000"], "http:// or https://"),
        (["--server", "ftp://127.0.0.1:8000"], "http:// or https://"),
        (["--server", "http://127.0.0.1:8000/api/v1"], "without /api/v1"),
        (["--server", "http://127.0.0.1:8000/api/v1/"], "without /api/v1"),
        (["--server", "http://127.0.0.1:8000/gantry/api/v1/runner-groups/poll"], "without /api/v1"),
        (["--server", "http://127.0.0.1:notaport"], "malformed port"),
        (["--server", "http://127.0.0.1:8000", "--launcher", "nope"], "--launcher"),
        (["--server", "http://127.0.0.1:8000", "--health-addr", "8081"], "--health-addr"),
        (["--server", "http://127.0.0.1:8000", "--health-addr", "127.0.0.1:99999"], "--health-addr"),
        (["--server", "http://127.0.0.1:8000", "--launcher-option", "novalue"], "KEY=VALUE"),
        (["--server", "http://127.0.0.1:8000", "--backoff-cap", "0"], "--backoff-cap"),
        (["--server", "http://127.0.0.1:8000", "--launcher", "docker"], "image"),
    ],
)
def test_a_usage_error_exits_2_with_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    result = run(tmp_path, *args)
    assert result.returncode == EXIT_USAGE, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert says in lines[0]
    assert "Traceback" not in result.stderr


def test_a_health_address_in_use_exits_2_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        token = _jwt({"aud": "runner-group", "sub": "1"})
        result = run(tmp_path, "--server", f"http://127.0.0.1:{free_port()}", "--launcher", "fake",
                     "--health-addr", f"127.0.0.1:{port}", token=token)  # fmt: skip
    assert result.returncode == EXIT_USAGE, result.stderr
    [line] = result.stderr.splitlines()
    assert json.loads(line)["event"] == "coordinator.bad_health_addr"
    assert f"127.0.0.1:{port}" in line


def test_the_usage_still_shows_under_help(tmp_path: Path) -> None:
    result = run(tmp_path, "--help")
    assert result.returncode == 0
    assert "--health-addr HOST:PORT" in result.stdout


# ---------------------------------------------------------------- credentials: exit 3


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("abc", "three dot-separated parts"),
        ("a.b.c", "not base64url-encoded JSON"),
        (_jwt({"aud": "runner", "sub": "5f7c", "run": "x"}), "runner's token"),
        (_jwt({"aud": "runner-group"}), "names no group"),
    ],
)
def test_a_malformed_token_exits_3_before_any_request(tmp_path: Path, token: str, says: str) -> None:
    # Nothing listens there: a coordinator that sent a request would wait for it, never exit 3.
    result = run(tmp_path, "--server", f"http://127.0.0.1:{free_port()}", token=token)
    assert result.returncode == EXIT_REFUSED, result.stderr
    [line] = result.stderr.splitlines()
    assert "the group token is malformed" in json.loads(line)["msg"]
    assert says in line
    assert token not in line  # the credential itself is never logged


@pytest.mark.django_db(transaction=True)
def test_a_revoked_token_exits_3_saying_so(site: Site, tmp_path: Path) -> None:
    services.runner_group_rotate_token(group=site.group)
    result = run(tmp_path, "--server", site.url, "--launcher", "fake", token=site.group_token)
    assert result.returncode == EXIT_REFUSED, result.stderr
    refused = [json.loads(line) for line in result.stderr.splitlines() if "coordinator.refused" in line]
    assert len(refused) == 1
    assert "revoked" in refused[0]["msg"]
    assert site.group_token not in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_token_signed_elsewhere_exits_3_saying_the_server_cannot_verify_it(site: Site, tmp_path: Path) -> None:
    foreign = _jwt({"iss": "gantry", "aud": "runner-group", "sub": str(site.group.id), "ver": 1})
    result = run(tmp_path, "--server", site.url, "--launcher", "fake", token=foreign)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert "cannot verify the group token" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_url_below_gantrys_root_is_not_a_gantry_server(site: Site, tmp_path: Path) -> None:
    result = run(tmp_path, "--server", f"{site.url}/gantry", "--launcher", "fake", token=site.group_token)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert "does not answer as a Gantry server" in result.stderr
    assert "404" in result.stderr


@pytest.fixture
def web_page() -> Iterator[str]:
    """Some other web server on loopback: a GET under /moved answers a redirect, any other an HTML page."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>welcome</body></html>"
            moved = self.path.startswith("/moved/")
            self.send_response(301 if moved else 200)
            if moved:
                self.send_header("Location", "https://gantry.example.com/")
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("path", "says"), [("", "200, \"the answer is not Gantry's\""),
                                           ("/moved", "301, 'redirected to https://gantry.example.com/'")])  # fmt: skip
def test_a_web_server_that_is_not_gantry_exits_3(web_page: str, tmp_path: Path, path: str, says: str) -> None:
    token = _jwt({"aud": "runner-group", "sub": "1"})
    result = run(tmp_path, "--server", web_page + path, "--launcher", "fake", token=token)
    assert result.returncode == EXIT_REFUSED, result.stderr
    [line] = [json.loads(line)["msg"] for line in result.stderr.splitlines() if "coordinator.refused" in line]
    assert "does not answer as a Gantry server" in line
    assert says in line


def test_header_names_in_any_case_are_read(tmp_path: Path) -> None:
    # HTTP's header names are case-insensitive and servers differ: uvicorn (the production server) sends
    # them lowercased, pytest-django's live_server (the other tests' site) as Django wrote them. A
    # Gantry-shaped demand answer with lowercase names must pass the start-up check (the coordinator
    # goes on to poll), as it must under `dev.py run` and gunicorn.
    polls: list[str] = []

    class Lowercase(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/api/v1/runner-groups/poll"):
                polls.append(self.path)
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            body = json.dumps({"runnable": 0, "running": 0, "max_concurrent_runs": 1}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Lowercase)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = _jwt({"aud": "runner-group", "sub": "1"})
    proc = start(tmp_path, "--server", f"http://127.0.0.1:{server.server_address[1]}", "--launcher", "fake",
                 token=token)  # fmt: skip
    try:
        wait_until(lambda: bool(polls) or proc.poll() is not None, 30, "a poll after the start-up check")
        assert proc.poll() is None, proc.communicate()[1]
        assert polls
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- health and metrics


def test_an_unreachable_server_is_waited_for_and_healthz_turns_503(tmp_path: Path) -> None:
    health = free_port()
    # Bound: max(3 x 0.05, 2 x 0 + 0.2, 2 x 0.1 + 0.2) = 0.4 s without an answer.
    proc = start(tmp_path, "--server", f"http://127.0.0.1:{free_port()}", "--launcher", "fake",
                 "--health-addr", f"127.0.0.1:{health}", "--backoff-cap", "0.05", "--wait", "0",
                 "--timeout", "0.2", "--reconcile-interval", "0.1",
                 token=_jwt({"aud": "runner-group", "sub": "1"}))  # fmt: skip
    try:
        found: list[tuple[int, str]] = []

        def unhealthy() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                found.append(_get(f"http://127.0.0.1:{health}/healthz"))
            except OSError:
                return False  # not listening yet
            return found[-1][0] == 503

        wait_until(unhealthy, 30, "/healthz to say 503")
        body = json.loads(found[-1][1])
        assert body["status"] == "unhealthy"
        assert "no successful answer from Gantry" in body["reason"]
        assert body["stale_after"] == 0.4
        # Still waiting for its server, not exited: a server that is down at start is normal.
        assert proc.poll() is None
        status, text = _get(f"http://127.0.0.1:{health}/metrics")
        assert status == 200
        assert "gantry_coordinator_last_contact_timestamp_seconds" not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "server check failed" in stderr


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.django_db(transaction=True)
def test_healthz_and_metrics_while_polling_a_real_server(site: Site, tmp_path: Path) -> None:
    health = free_port()
    proc = start(tmp_path, "--server", site.url, "--launcher", "local", "--health-addr", f"127.0.0.1:{health}",
                 "--wait", "0", "--reconcile-interval", "0.5", token=site.group_token)  # fmt: skip
    try:
        seen: dict[str, str] = {}

        def polled_empty() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                seen["metrics"] = _get(f"http://127.0.0.1:{health}/metrics")[1]
            except OSError:
                return False
            return _samples(seen["metrics"]).get(("gantry_coordinator_polls_total", (("outcome", "empty"),)), 0) >= 1

        wait_until(polled_empty, 30, "an empty poll counted")
        for name in METRIC_NAMES:
            assert f"# TYPE {name} " in seen["metrics"], name
        samples = _samples(seen["metrics"])
        assert samples[("gantry_coordinator_workers_running", ())] == 0
        assert samples[("gantry_coordinator_launches_total", (("launcher", "local"),))] == 0
        assert samples[("gantry_coordinator_polls_total", (("outcome", "unauthorized"),))] == 0
        assert samples[("gantry_coordinator_last_contact_timestamp_seconds", ())] > 0
        status, body = _get(f"http://127.0.0.1:{health}/healthz")
        assert status == 200, body
        assert json.loads(body)["loops"] == {"poll": True, "reconcile": True}
        assert _get(f"http://127.0.0.1:{health}/nothing")[0] == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


@pytest.mark.django_db(transaction=True)
def test_metrics_count_launches_failures_and_refusals(site: Site) -> None:
    world_launcher = FakeLauncher()
    coord = Coordinator(GantryClient(site.url, site.group_token, timeout=10), world_launcher, QUICK)
    server = HealthServer(("127.0.0.1", 0), coord.verdict, coord.metrics_text)
    server.start()
    url = f"http://127.0.0.1:{server.address[1]}/metrics"
    try:
        site.deploy({"steps": [{"name": "x", "run": "true"}]})
        coord.step()
        samples = _samples(_get(url)[1])
        assert samples[("gantry_coordinator_launches_total", (("launcher", "fake"),))] == 1
        assert samples[("gantry_coordinator_workers_running", ())] == 1
        assert samples[("gantry_coordinator_polls_total", (("outcome", "assigned"),))] == 1

        # A rotated token: later polls keep retrying, counted as unauthorized, logged as revoked.
        services.runner_group_rotate_token(group=site.group)
        coord.poll_turn()
        samples = _samples(_get(url)[1])
        assert samples[("gantry_coordinator_polls_total", (("outcome", "unauthorized"),))] == 1
        assert samples[("gantry_coordinator_launch_failures_total", (("reason", "permanent"),))] == 0
    finally:
        server.stop()


def test_the_exposition_passes_promtools_lint() -> None:
    metrics = CoordinatorMetrics("local")
    metrics.polled("empty")
    metrics.launch_failed("startup")
    text = metrics.exposition(workers=2, last_contact=1_790_000_000.5)
    promtool = require_tool("promtool", "prometheus")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    samples = _samples(text)
    assert samples[("gantry_coordinator_polls_total", (("outcome", "empty"),))] == 1
    assert samples[("gantry_coordinator_launch_failures_total", (("reason", "startup"),))] == 1
    assert samples[("gantry_coordinator_last_contact_timestamp_seconds", ())] == 1_790_000_000.5


def test_judge_says_why_it_is_unhealthy() -> None:
    alive = {"poll": True, "reconcile": True}
    assert judge(loops=alive, last_contact=100.0, started=0.0, stale_after=10, now=105.0).ok
    stale = judge(loops=alive, last_contact=100.0, started=0.0, stale_after=10, now=111.0)
    assert not stale.ok
    assert "last successful answer from Gantry for 11s" in stale.reason
    dead = judge(loops={"poll": True, "reconcile": False}, last_contact=100.0, started=0.0, stale_after=10, now=101.0)
    assert (dead.ok, dead.reason) == (False, "loop stopped: reconcile")
    # Before any answer the start counts as one: a server still starting is not yet a failure.
    assert judge(loops=alive, last_contact=None, started=100.0, stale_after=10, now=109.0).ok
