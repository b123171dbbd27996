"""Throttle test fixtures: clean buckets around every test, and a Redis server a test controls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

from gantry import conf
from gantry import redis as gantry_redis
from tests.throttle.helpers import RedisProcess


@pytest.fixture(autouse=True)
def _clean_buckets(clean_buckets: None) -> None:
    """Every throttle test starts and ends with no bucket (tests/conftest.py)."""


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A real redis-server of this test's own, which settings.REDIS_URL points at for the test."""
    server = RedisProcess(dir=tmp_path)
    server.start()
    try:
        with override_settings(REDIS_URL=server.url):
            yield server
    finally:
        server.kill()
        gantry_redis.reset()  # drop the dead server's client and its sockets


@pytest.fixture
def rate_limit_disabled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GANTRY_RATE_LIMIT_ENABLED", "false")
    conf.get.cache_clear()
    yield
    monkeypatch.undo()
    conf.get.cache_clear()
