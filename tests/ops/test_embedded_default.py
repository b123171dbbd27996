"""The embedded default: with no DATABASE_URL / REDIS_URL, Gantry brings its own servers.

This starts real processes: ``manage.py migrate`` boots an embedded PostgreSQL
and Redis in a fresh data folder, gunicorn serves, ``/readyz`` must say both
answer. Then ``dev.py stop`` must end the servers of that folder, and nothing
may be left running, whatever happened in between.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 60.0


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _pid(path: Path) -> int | None:
    try:
        first = path.read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(first) if first.isdigit() else None


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


@pytest.mark.e2e
def test_it_serves_on_embedded_postgres_and_redis(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env["GANTRY_DATA_DIR"] = str(data)
    env["GANTRY_EMBEDDED"] = "1"  # on purpose: these tests are about the embedded databases
    server_pids: dict[str, int] = {}

    def leave_nothing_behind() -> None:
        # Runs however the test ends; the happy path has already stopped everything.
        subprocess.run([sys.executable, str(ROOT / "dev.py"), "stop"], env=env, capture_output=True, timeout=90)
        for pid in server_pids.values():
            if _running(pid):
                os.kill(pid, signal.SIGKILL)

    request.addfinalizer(leave_nothing_behind)

    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    pg_pid = _pid(data / "postgres" / "postmaster.pid")
    redis_pid = _pid(data / "redis" / "redis.pid")
    if pg_pid:
        server_pids["postgres"] = pg_pid
    if redis_pid:
        server_pids["redis"] = redis_pid
    assert migrate.returncode == 0, migrate.stderr
    assert pg_pid, "no postmaster.pid in the data folder"
    assert _running(pg_pid), "the embedded PostgreSQL is not running"
    assert redis_pid, "no redis.pid in the data folder"
    assert _running(redis_pid), "the embedded Redis is not running"

    port = free_port()
    log = (tmp_path / "gunicorn.log").open("w")
    web = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "gantry.wsgi", "-b", f"127.0.0.1:{port}"),
            *("--worker-class", "gthread", "--threads", "4", "--no-control-socket"),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def stop_web() -> None:
        if web.poll() is None:
            web.terminate()
            try:
                web.wait(15)
            except subprocess.TimeoutExpired:
                web.kill()
                web.wait()
        log.close()

    request.addfinalizer(stop_web)

    status, body = 0, {}
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and web.poll() is None:
        try:
            status, body = _get(f"http://127.0.0.1:{port}/readyz")
        except (urllib.error.URLError, OSError, ValueError):
            status = 0
        if status == 200:
            break
        time.sleep(0.3)
    assert status == 200, f"/readyz answered {status} {body}; log:\n{(tmp_path / 'gunicorn.log').read_text()}"
    assert body == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}

    stop_web()
    assert web.returncode is not None
    stop = subprocess.run(
        [sys.executable, str(ROOT / "dev.py"), "stop"], env=env, capture_output=True, text=True, timeout=90
    )
    assert stop.returncode == 0, stop.stderr
    assert f"PostgreSQL: stopped (pid {pg_pid})" in stop.stdout
    assert f"Redis: stopped (pid {redis_pid})" in stop.stdout
    assert not _running(pg_pid)
    assert not _running(redis_pid)
