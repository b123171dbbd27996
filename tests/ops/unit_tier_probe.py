"""Unit-tier tests that break the tier's rule on purpose: each opens a PostgreSQL or Redis connection.

Not collected by the suite (no ``test_`` prefix): ``tests/ops/test_unit_tier.py``
runs them in a subprocess, where the unit tier's guard (``tests/conftest.py``)
must fail every one with an error naming it.
"""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
import redis
import redis.asyncio
from django.conf import settings

from gantry.redis import client as redis_client


def test_probe_opens_redis() -> None:
    redis_client().ping()


def test_probe_opens_redis_from_asyncio() -> None:
    async def ping() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            await client.ping()
        finally:
            await client.aclose()

    asyncio.run(ping())


def test_probe_opens_postgresql() -> None:
    with psycopg.connect(settings.DATABASE_URL, connect_timeout=2):
        pass


def test_probe_swallows_what_redis_raised() -> None:
    # What Gantry's fail-open paths do (metrics, live logs): without the guard this passes.
    with contextlib.suppress(Exception):
        redis_client().ping()
