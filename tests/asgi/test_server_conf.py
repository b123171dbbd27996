"""The server process's knobs (gantry.conf.server()): read and checked in one place, a bad one stops the start."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from gantry import conf

ROOT = Path(__file__).resolve().parents[2]
KNOBS = ("GANTRY_SYNC_THREADS", "GANTRY_POLL_THREADS", "GANTRY_FAST_LANE", "GANTRY_LANE_DB_POOL_MAX",
         "GANTRY_FAST_LANE_LOOP", "GANTRY_POLL_RECHECK_SECONDS")  # fmt: skip


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """conf.server() read anew under the test's environment, and as it was after the test."""
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    conf.server.cache_clear()
    yield monkeypatch
    conf.server.cache_clear()


def test_it_has_its_defaults(fresh: pytest.MonkeyPatch) -> None:
    assert conf.server() == conf.ServerConf(
        sync_threads=16, poll_threads=3, fast_lane=True, lane_db_pool_max=8, fast_lane_loop=True,
        poll_recheck_seconds=5.0,
    )  # fmt: skip


def test_it_reads_each_knob(fresh: pytest.MonkeyPatch) -> None:
    for name, value in [("GANTRY_SYNC_THREADS", "4"), ("GANTRY_POLL_THREADS", "2"), ("GANTRY_FAST_LANE", "off"),
                        ("GANTRY_LANE_DB_POOL_MAX", "3"), ("GANTRY_FAST_LANE_LOOP", "false"),
                        ("GANTRY_POLL_RECHECK_SECONDS", "0.5")]:  # fmt: skip
        fresh.setenv(name, value)
    assert conf.server() == conf.ServerConf(4, 2, False, 3, fast_lane_loop=False, poll_recheck_seconds=0.5)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GANTRY_SYNC_THREADS", "0"),
        ("GANTRY_POLL_THREADS", "three"),
        ("GANTRY_FAST_LANE", "maybe"),
        ("GANTRY_LANE_DB_POOL_MAX", "0"),
        ("GANTRY_FAST_LANE_LOOP", "2"),
        ("GANTRY_POLL_RECHECK_SECONDS", "0"),
        ("GANTRY_POLL_RECHECK_SECONDS", "nan"),
        ("GANTRY_POLL_RECHECK_SECONDS", "soon"),
    ],
)
def test_it_refuses_a_bad_knob_naming_it(fresh: pytest.MonkeyPatch, name: str, value: str) -> None:
    fresh.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        conf.server()


def test_the_server_does_not_start_with_a_bad_knob() -> None:
    env = {**os.environ, "GANTRY_SYNC_THREADS": "0"}
    result = subprocess.run([sys.executable, "-c", "import gantry.asgi"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "ImproperlyConfigured: GANTRY_SYNC_THREADS=0 is below its minimum 1" in result.stderr
