"""The unit tier runs with PostgreSQL and Redis both closed, and its guard fails a unit test that connects.

One pytest subprocess, ``-m unit`` over files whose other tests reach Redis
and PostgreSQL (tests/reapers, whose autouse fixture cleans Redis for them;
the ops endpoints; the API's auth and error codes), plus four probes that
connect on purpose (``unit_tier_probe.py``), with ``DATABASE_URL`` and
``REDIS_URL`` on port 1, where nothing listens: every unit test passes, and
every probe fails with the guard's error naming it (not a refused connection).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLOSED = {"DATABASE_URL": "postgres://postgres@127.0.0.1:1/closed", "REDIS_URL": "redis://127.0.0.1:1/0"}
PROBES = (
    "test_probe_opens_redis",
    "test_probe_opens_redis_from_asyncio",
    "test_probe_opens_postgresql",
    "test_probe_swallows_what_redis_raised",
)

# It starts a process (pytest), so it is not in the unit tier itself.
pytestmark = pytest.mark.e2e


def test_the_unit_tier_needs_neither_postgresql_nor_redis() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GANTRY_REDIS_DB"))}
    env.update(CLOSED, COLUMNS="500")  # the failures' summary lines whole
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-m", "unit", "-p", "no:cacheprovider", "-q", "-rf", "--tb=no",
            "tests/reapers", "tests/ops/test_endpoints.py", "tests/api/test_auth.py", "tests/api/test_error_codes.py",
            "tests/ops/unit_tier_probe.py",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]  # "4 failed, 12 passed, 101 deselected in 3.68s"
    counts = {word.rstrip("s"): int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}
    assert counts.pop("passed", 0) >= 5, out[-4000:]  # the real unit tests ran, and passed
    counts.pop("deselected", None)
    assert counts == {"failed": len(PROBES)}, out[-4000:]  # the probes, and nothing else (no error, no skip)
    for probe in PROBES:
        line = next((x for x in out.splitlines() if x.startswith("FAILED") and f"::{probe} " in x), "")
        assert "ServiceInUnitTest" in line, out[-4000:]
        assert "is in the unit tier" in line, line
