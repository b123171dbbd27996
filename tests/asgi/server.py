"""The production server mode as a child process (gunicorn, uvicorn's worker, ``gantry.asgi``) on the test database."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from tests.childdb import database_url
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
POLL = "/api/v1/runner-groups/poll"


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base: str
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        assert found, f"{name} not in /metrics"
        return float(found.group(1))


@contextmanager
def asgi_server(
    tmp: Path, *, workers: int = 1, gunicorn_args: tuple[str, ...] = (), **env_extra: str
) -> Iterator[Server]:
    """One worker by default (so /metrics's per-process figures are the whole server); gunicorn.conf.py as in
    production. ``gunicorn_args`` go after the usual ones."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL}
    env.update({"GANTRY_LOG_LEVEL": "WARNING", **env_extra})
    log = tmp / f"gunicorn-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "gantry.asgi", "-b", f"127.0.0.1:{port}",
                "--worker-class", "uvicorn_worker.UvicornWorker", "--workers", str(workers), "--no-control-socket",
                *gunicorn_args,
            ],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"gunicorn exited:\n{server.tail()}"
            try:
                with urllib.request.urlopen(f"{server.base}/healthz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn never answered /healthz"
                time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@dataclass
class Answer:
    status: int
    body: Any
    content_type: str | None
    headers: dict[str, str] | None = None


def get(base: str, path: str, *, token: str | None = None, timeout: float = 60) -> Answer:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        raw = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders() if k.lower() not in ("date", "server")}
        return Answer(resp.status, json.loads(raw) if raw else None, resp.getheader("Content-Type"), headers)
    finally:
        conn.close()


def wait_until(predicate: Any, what: str, seconds: float = 20) -> None:
    """Poll ``predicate`` until it holds; ``seconds`` is a hang guard, not a figure under test."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"hang guard, {seconds:g} s: {what}"
        time.sleep(0.02)
