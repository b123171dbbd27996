"""Reaper fixtures: log storage in a folder of the test's own, and Redis left as the test found it.

The reapers flush lost runs' live logs through the real ``gantry.logs``
(Redis and the local store, or S3 on the moto server where a test asks for
it); nothing of Gantry's own is stood in for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

from gantry.core.models import Run
from gantry.logs import live
from gantry.logs.reader import INDEX_KEY
from gantry.reapers import retention
from gantry.redis import client as redis_client
from tests.conftest import in_unit_tier


@pytest.fixture(autouse=True)
def log_dir(tmp_path: Path) -> Iterator[Path]:
    """Local log storage in the test's own folder (S3 off unless a test asks for it)."""
    folder = tmp_path / "logs"
    with override_settings(GANTRY_LOG_DIR=str(folder), GANTRY_S3_BUCKET=""):
        yield folder


@pytest.fixture(autouse=True)
def redis_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """The retention cursor starts afresh; the live records and chunk indexes of the test's runs are dropped.

    Not for a unit-tier test (``manage.py reap`` refusing its arguments): it has no Redis to clean.
    """
    if in_unit_tier(request.node):
        yield
        return
    redis_client().delete(retention._cursor_key())
    yield
    redis_client().delete(retention._cursor_key())
    try:
        ids = list(Run.objects.values_list("id", flat=True))
    except Exception:  # a test without database access
        return
    keys = [k.format(run_id=run_id) for run_id in ids for k in (live.KEY, INDEX_KEY)]
    if keys:
        redis_client().delete(*keys)
