"""A graceful stop of the real server does not wait for parked long polls (gunicorn.conf.py).

gunicorn (gthread, the repository's gunicorn.conf.py picked up from the working
directory as in production) serves the test database. A coordinator's poll
parks with ``wait=30``; then the master gets SIGTERM. The poll must be
answered 204 and the server must exit 0, instead of the poll holding the
worker. gunicorn's graceful timeout is 20 s here, shorter than the poll's
wait: without the hook the worker would hold the poll until that timeout cut
the connection, with no answer at all, so the 204 itself says the hook
answered it (no figure of how fast is asserted).
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from gantry.core import services
from gantry.core.models import Organization, RunnerGroup
from tests.childdb import database_url
from tests.ports import free_port

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30
GRACEFUL_TIMEOUT = 20  # < WAIT: without the hook, the poll is cut off before its own deadline


def _status(url: str, token: str) -> int | str:
    """The answer's status, or what became of a request that got none (the connection cut)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=WAIT + 15) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, http.client.HTTPException) as exc:
        return f"no answer: {exc!r}"


def _last_polled(group: RunnerGroup) -> Any:
    return RunnerGroup.objects.values_list("last_polled_at", flat=True).get(id=group.id)


def test_sigterm_answers_a_parked_poll_at_once_and_the_server_exits(acme: Organization, tmp_path: Path) -> None:
    group, token = services.runner_group_create(org=acme, name="lp", labels={"os": "linux"})
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL}
    env["GANTRY_LOG_LEVEL"] = "WARNING"
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "gantry.wsgi", "-b", f"127.0.0.1:{port}",
                "--worker-class", "gthread", "--threads", "4", "--no-control-socket",
                "--graceful-timeout", str(GRACEFUL_TIMEOUT),
            ],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"gunicorn exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn never answered /healthz"
                time.sleep(0.1)

        before = _last_polled(group)
        answer: list[int | str] = []
        poller = threading.Thread(
            target=lambda: answer.append(_status(f"{base}/api/v1/runner-groups/poll?wait={WAIT}", token)), daemon=True
        )
        poller.start()
        deadline = time.monotonic() + 15
        while _last_polled(group) == before:  # its first (empty) claim attempt has committed
            assert time.monotonic() < deadline, "the poll never reached the server"
            time.sleep(0.01)
        time.sleep(0.5)  # bounded: lets the request reach its wait; nothing depends on the exact figure
        assert poller.is_alive(), "the poll answered instead of parking"

        server.send_signal(signal.SIGTERM)
        poller.join(WAIT + 15)  # hang guards only
        exit_code = server.wait(WAIT + 15)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()

    # Answered, so by the hook: the graceful timeout would have cut it off unanswered before its deadline.
    assert answer == [204], log.read_text()[-3000:]
    assert exit_code == 0, log.read_text()[-3000:]
