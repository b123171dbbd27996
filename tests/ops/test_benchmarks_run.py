"""The benchmarks that reach into Gantry's internals still run to their report (at toy sizes).

The benchmarks are not timed here (their figures live in docs/performance.md);
this only proves that ``poll_claim`` and ``lifecycle``, which call the claim's
prepared statement and the production server directly, still run after a
change to either, as the claim's two new parameters once broke one unseen.
Each runs as a process against a database of its own (created by the bench,
dropped here) and a Redis database of its own (flushed here), so neither
touches the test database nor the tests' buckets; each test checks the bench
used exactly those (a bench once switched to a database of its choosing).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _bench_redis_db() -> int:
    current = int(settings.REDIS_URL.rsplit("/", 1)[-1] or 0)
    return (current + 4) % 16  # the tests' database is 8 above a server's; this is neither


@dataclass
class Bench:
    env: dict[str, str]
    database: str  # the database DATABASE_URL names
    redis_db: int  # GANTRY_REDIS_DB

    def used_what_it_was_given(self, out: str) -> None:
        """The bench said it used this database and Redis database, and its runs are in that database."""
        assert f"benchmark database {self.database} on " in out, out[:2000]
        assert f"; Redis {self.env['REDIS_URL'].rsplit('/', 1)[0]}/{self.redis_db}\n" in out, out[:2000]
        with psycopg.connect(make_conninfo(settings.DATABASE_URL, dbname=self.database)) as conn:
            row = conn.execute("SELECT count(*) FROM run").fetchone()
        assert row is not None
        assert row[0] > 0


@pytest.fixture
def bench(request: pytest.FixtureRequest) -> Iterator[Bench]:
    name = f"gantry_smoke_{request.node.name.removeprefix('test_')[:40]}"
    params = conninfo_to_dict(make_conninfo(settings.DATABASE_URL))
    host, port, user = params.get("host", "127.0.0.1"), params.get("port", "5432"), params.get("user", "postgres")
    if str(host).startswith("/"):
        url = f"postgres://{user}@/{name}?host={host}&port={port}"
    else:
        url = f"postgres://{user}@{host}:{port}/{name}"
    db = _bench_redis_db()
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": settings.REDIS_URL, "GANTRY_REDIS_DB": str(db)}
    try:
        yield Bench(env, name, db)
    finally:
        with psycopg.connect(make_conninfo(settings.DATABASE_URL, dbname="postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        client = redis.Redis.from_url(settings.REDIS_URL, db=db)
        client.flushdb()
        client.close()


def _run(module: str, args: list[str], bench: Bench) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=bench.env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    bench.used_what_it_was_given(done.stdout)
    return done.stdout


def test_poll_claim_runs_to_its_targets(bench: Bench) -> None:
    out = _run(
        "tests.bench.poll_claim",
        ["--sizes", "100", "--shapes", "adversarial", "--pollers", "1", "--seconds", "0.5", "--no-variants"],
        bench,
    )
    assert "targets: claim" in out, out[-2000:]
    assert "false empties at 1 poller while matching work exists: 0 PASS" in out, out[-2000:]
    assert "EXPLAIN (ANALYZE, BUFFERS)" in out, out[-2000:]


def test_lifecycle_runs_every_call_of_a_run(bench: Bench) -> None:
    out = _run("tests.bench.lifecycle", ["--ks", "1", "--seconds", "0.5", "--repeat", "1", "--runs", "1000"], bench)
    assert "errors 0" in out, out[-2000:]
    assert "targets at K=1" in out or "| 1 |" in out, out[-2000:]
    # Every call of the lifecycle was made and timed (a run that never got past the poll shows nan).
    calls = [line for line in out.splitlines() if line.startswith("| 1 | ") and "/" in line]
    assert calls, out[-2000:]
    assert "nan" not in calls[-1], calls[-1]
    # The ratio's make-up, from CPU per call of both phases (the client's included).
    explained = [line for line in out.splitlines() if line.startswith("the calls ratio from CPU")]
    assert explained, out[-2000:]
    assert "Predicted ratio" in explained[0], explained[0]
    assert "nan" not in explained[0], explained[0]
    # The live phase ran: pushes answered 204 and their records checked in Redis (the bench stops otherwise),
    # and its figures printed, in the round's line and in the table's last three columns.
    pushed = re.search(r"live +(\d+) pushes/s at (\d+\.\d+) ms CPU/push \((\d+) B a record in Redis\)", out)
    assert pushed, out[-2000:]
    assert int(pushed[1]) > 0, pushed[0]
    assert float(pushed[2]) > 0, pushed[0]
    assert int(pushed[3]) > 0, pushed[0]
    assert "| live CPU/push ms (py + pg) | live pushes/s | Redis B/live record |" in out, out[-2000:]
    row = next(line for line in out.splitlines() if line.startswith("| 1 | "))
    assert re.search(r"\| \d+\.\d\d \(\d+\.\d\d \+ \d+\.\d\d\) \| \d+ \| \d+ \|$", row), row


def test_e2e_latency_times_real_runs_sequential_and_burst(bench: Bench) -> None:
    out = _run("tests.bench.e2e_latency", ["--runs", "2", "--burst", "2", "--max-parallel", "2"], bench)
    rows = {line.split("|")[0].strip(): line for line in out.splitlines() if line.startswith("cold ")}
    assert set(rows) == {"cold sequential", "cold burst"}, out[-2000:]
    # Every run was timed to running, its output and its end (a "-" is a mark never seen).
    for line in rows.values():
        assert " - " not in line, line
    assert float(rows["cold burst"].split("|")[-1]) > 0, rows["cold burst"]
