"""Builders for the throttle tests: buckets in the test Redis, a Redis server a test can kill, metric reads."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from gantry import embedded
from gantry import redis as gantry_redis
from gantry.core import tokens
from gantry.core.models import Organization, RunnerGroup, Stack
from gantry.dispatch import throttle
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.ports import free_port


def clear_buckets(client: redis.Redis | None = None) -> None:
    """Delete every throttle bucket (our key prefix only) from the configured Redis database."""
    client = client or gantry_redis.client()
    keys = list(client.scan_iter(match=throttle.KEY_PREFIX + "*", count=1000))
    if keys:
        client.delete(*keys)


def bucket_exists(org: Organization) -> bool:
    return bool(gantry_redis.client().exists(throttle.key_for(org.id)))


def tokens_of(org: Organization) -> float:
    """The org's tokens now, by a peek (which writes nothing)."""
    org.refresh_from_db()
    return throttle.peek(organization_id=org.id, rate=org.runs_per_hour_limit).tokens


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def fail_opens() -> float:
    return metric("gantry_throttle_fail_open_total")


def dispatches(outcome: str) -> float:
    return metric("gantry_org_run_dispatch_total", outcome=outcome)


def group_api(group: RunnerGroup) -> APIClient:
    """A coordinator's client: the group's JWT."""
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION="Bearer " + tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    )
    return client


def backlog(org: Organization, n: int, *, prefix: str = "s") -> list[Stack]:
    """``n`` stacks with one pending run each (a stack holds one live run at a time)."""
    stacks = [make_stack(org, f"{prefix}{i}", {"os": "linux"}) for i in range(n)]
    for s in stacks:
        deploy(s)
    return stacks


def wide_group(org: Organization, name: str = "wide") -> RunnerGroup:
    """A group that serves the backlog and never runs out of slots in these tests."""
    return make_group(org, name, {"os": "linux"}, max_concurrent_runs=1000)


def redis_binary() -> str:
    found = shutil.which("redis-server")
    return found or str(embedded.redis_server_binary())


@dataclass
class RedisProcess:
    """A redis-server of the test's own, on a free port: the test may stop and restart it."""

    dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)
