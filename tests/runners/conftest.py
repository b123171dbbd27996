"""Fixtures for the client-side tests that talk to a real server: pytest-django's ``live_server``.

The server is a thread of the test process on the test database; the
ephemeral runner under test is a real subprocess that reaches it over HTTP
only, exactly as a launched runner would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from gantry import conf
from gantry.core import services
from gantry.core.models import Organization, Run, RunnerGroup, Stack
from gantry.dispatch.claim import Claim, claim

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fast_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Status polls and live ticks every second (RunContext carries them), so tests wait less."""
    quick = dataclasses.replace(conf.get(), status_interval=1, live_log_interval=1)
    monkeypatch.setattr(conf, "get", lambda: quick)


@dataclass
class Site:
    url: str
    org: Organization
    group: RunnerGroup
    group_token: str
    stack: Stack
    user_token: str
    tmp: Path

    def deploy(self, spec: dict[str, Any]) -> Run:
        deployment = services.deployment_create(stack=self.stack, spec=spec)
        return Run.objects.get(deployment=deployment)

    def claim(self) -> Claim:
        got = claim(group=self.group)
        assert got is not None, "nothing to claim"
        return got


@pytest.fixture
def site(
    live_server: Any, acme: Organization, teammate: User, settings: Any, tmp_path: Path, fast_intervals: None
) -> Site:
    settings.GANTRY_LOG_DIR = str(tmp_path / "logs")
    settings.GANTRY_S3_BUCKET = ""
    services.org_set_runs_per_hour_limit(org=acme, limit=10_000)
    group, token = services.runner_group_create(org=acme, name="runners", labels={"os": "linux"})
    stack = services.stack_create(
        org=acme,
        name="app",
        labels={"gantry:runner-group:os": "linux"},
        spec={"steps": [{"name": "hello", "run": "echo hello"}]},
        secrets={"API_KEY": "s3cret"},
    )
    user_token, _ = Token.objects.get_or_create(user=teammate)
    return Site(live_server.url, acme, group, token, stack, user_token.key, tmp_path)


@dataclass
class RunnerProcess:
    proc: subprocess.Popen[bytes]
    stderr: Path

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def events(self) -> list[dict[str, Any]]:
        lines = self.stderr.read_text().splitlines() if self.stderr.exists() else []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def event_names(self) -> list[str]:
        return [str(e.get("event")) for e in self.events()]


def start_runner(site: Site, got: Claim, **env: str) -> RunnerProcess:
    """``python -m runners.ephemeral`` with its configuration in the environment, as a launcher starts it."""
    stderr = site.tmp / f"runner-{got.run_id}.log"
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(ROOT),
        "GANTRY_SERVER": site.url,
        "GANTRY_RUN_ID": str(got.run_id),
        "GANTRY_RUNNER_ID": str(got.runner_id),
        "GANTRY_RUNNER_TOKEN": got.runner_token,
        "GANTRY_WORK_DIR": str(site.tmp / "work"),
        "GANTRY_EXIT_FILE": str(site.tmp / f"{got.run_id}.exit"),
        "GANTRY_STOP_GRACE": "3",
        **env,
    }
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runners.ephemeral"],
            cwd=ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
        )
    return RunnerProcess(proc, stderr)


@pytest.fixture
def runners() -> Iterator[list[RunnerProcess]]:
    """Runner processes a test started: killed at the end whatever happened."""
    started: list[RunnerProcess] = []
    yield started
    for r in started:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


def wait_until(cond: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
