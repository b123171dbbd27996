"""Reaper-sweep benchmark: one beat tick (all four reapers) over big run tables, few or many rows due.

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.reaper_sweep [--sizes 100000,1000000] [--due 0.001,0.01] [--batch-size 500]
    python -m tests.bench.reaper_sweep --sizes 1000000 --lost 10000   # a node dies with 10,000 runners

The database is exactly the one ``DATABASE_URL`` names (default
``postgres://postgres@127.0.0.1:5432/gantry_bench_reap``), created when missing
and migrated. Its Gantry tables are TRUNCATEd for every case: name a scratch
database (one holding a superuser is refused). ``--lost`` writes live-log
records to a Redis database of the bench's own on ``REDIS_URL``'s server, four
above its database unless ``GANTRY_REDIS_DB`` says (tests/bench/common.py),
never the configured one. A measurement, not a test: it prints a table and
exits 0. The figures and their reading are in docs/reapers.md.

Each case (table size N, due fraction f) loads, set-based (INSERT … SELECT
over ``generate_series``, triggers and FK checks off for the load):

- N·f due rows, split evenly over five windows: assigned runs whose lease
  lapsed a minute ago (their stubs are young), pending runs eligible two hours
  ago (past the 30-minute startup deadline), running runs whose busy runner was
  last seen two hours ago (past the 1-hour execution timeout), never-started
  runs stuck in requested_cancellation whose lease lapsed a minute ago, and
  pending runs held by a stub created 20 minutes ago (past the 10-minute stub
  cutoff);
- a live background that sits in the reapers' indexes but is not due: 600
  assigned runs with live leases and young stubs, 600 recently pending runs,
  600 running runs whose runners polled seconds ago;
- the rest finished history (succeeded runs, no runner), which is what a run
  table is mostly made of and what the sweeps must not pay for.

Then, after VACUUM ANALYZE:

1. an *empty* tick: every reaper as of three hours earlier, when nothing in
   the table is due yet (the selection's fixed cost on a full table);
2. the selection alone: every due id paged through in batches, no transitions;
3. the tick: every reaper once, as of the load instant, with no row cap, so
   one sweep takes every due row. Its time per reaper and per due row.

The largest case also prints EXPLAIN (ANALYZE, BUFFERS) of each reaper's first
selection batch (in a rolled-back transaction).

``--lost L`` loads instead L busy runners silent for two hours (their runs
running, each with a live-log record in Redis and another run queued behind
it on its stack) in a table of N runs, and times one tick of the inactive
reaper with its default bounds: every run failed, every live log flushed to
the local store (a temporary folder), every lane promoted, every runner row
deleted, in one tick.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_reap"
BACKGROUND_PER_KIND = 600
CATEGORIES = ("expired", "startup", "lost", "backstop", "stub")

# --------------------------------------------------------------------------- loading

# One row per run to create: its rank g, its category, its stack rank, and
# the ids it will carry. Live runs get a stack each (one lane holder per
# stack); history runs share those stacks.
_PLAN_SQL = """
CREATE TEMP TABLE bench_plan ON COMMIT DROP AS
SELECT g,
       CASE
         WHEN g <= %(due)s THEN (%(kinds)s::text[])[1 + (g - 1) %% cardinality(%(kinds)s::text[])]
         WHEN g <= %(due)s + %(bg)s THEN (ARRAY['bg_assigned','bg_pending','bg_running'])[1 + (g - 1) %% 3]
         ELSE 'done'
       END AS kind,
       1 + (g - 1) %% %(stacks)s AS stack_rank,
       gen_random_uuid() AS run_id,
       gen_random_uuid() AS runner_id
FROM generate_series(1, %(n)s) g
"""

_LOAD_SQL = """
WITH s AS (
    INSERT INTO stack (organization_id, name, labels, spec, secrets, created_at)
    SELECT %(org)s, 'b-' || k, '{}'::jsonb, NULL, '{}'::jsonb, %(now)s - interval '30 days'
    FROM generate_series(1, %(stacks)s) k
    RETURNING id, split_part(name, '-', 2)::int AS rank
),
d AS (
    INSERT INTO deployment (stack_id, status, created_by_id, spec, created_at, updated_at)
    SELECT s.id, CASE WHEN p.kind = 'done' THEN 'succeeded' ELSE 'queued' END, NULL,
           jsonb_build_object('g', p.g), %(now)s - interval '30 days', %(now)s - interval '30 days'
    FROM bench_plan p JOIN s ON s.rank = p.stack_rank
    RETURNING id, stack_id, (spec->>'g')::int AS g
),
r AS (
    INSERT INTO runner (id, runner_group_id, status, created_at, ready_at, accepted_at, last_seen_at,
                        hostname, launcher, container_id, pod_name)
    SELECT p.runner_id, %(group)s,
           CASE WHEN p.kind IN ('lost', 'bg_running') THEN 'busy' ELSE 'not_ready' END,
           CASE p.kind WHEN 'expired' THEN %(now)s - interval '6 minutes'
                       WHEN 'stub' THEN %(now)s - interval '20 minutes'
                       WHEN 'bg_assigned' THEN %(now)s - interval '1 minute'
                       ELSE %(now)s - interval '3 hours' END,
           NULL,
           CASE WHEN p.kind IN ('lost', 'bg_running') THEN %(now)s - interval '3 hours' END,
           CASE p.kind WHEN 'lost' THEN %(now)s - interval '2 hours'
                       WHEN 'bg_running' THEN %(now)s - interval '10 seconds' END,
           '', '', '', ''
    FROM bench_plan p WHERE p.kind IN ('expired', 'lost', 'stub', 'bg_assigned', 'bg_running')
    RETURNING id
)
INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector, selector_id,
                 assigned_runner_id, assigned_at, assigned_expires_at, first_pending_at, started_at, finished_at,
                 exit_code, failure_reason, sealed_chunks, created_at, updated_at)
SELECT p.run_id, %(org)s, d.stack_id, d.id, 1,
       CASE p.kind WHEN 'expired' THEN 'assigned' WHEN 'bg_assigned' THEN 'assigned'
                   WHEN 'startup' THEN 'pending' WHEN 'stub' THEN 'pending' WHEN 'bg_pending' THEN 'pending'
                   WHEN 'lost' THEN 'running' WHEN 'bg_running' THEN 'running'
                   WHEN 'backstop' THEN 'requested_cancellation' ELSE 'succeeded' END,
       '{}'::jsonb, %(selector)s,
       CASE WHEN p.kind IN ('expired', 'lost', 'stub', 'bg_assigned', 'bg_running') THEN p.runner_id END,
       CASE p.kind WHEN 'expired' THEN %(now)s - interval '6 minutes'
                   WHEN 'backstop' THEN %(now)s - interval '6 minutes'
                   WHEN 'bg_assigned' THEN %(now)s - interval '1 minute' END,
       -- The stuck cancellations were assigned when they got stuck: their lease lapsed a minute ago.
       CASE p.kind WHEN 'expired' THEN %(now)s - interval '1 minute'
                   WHEN 'backstop' THEN %(now)s - interval '1 minute'
                   WHEN 'bg_assigned' THEN %(now)s + interval '4 minutes' END,
       CASE p.kind WHEN 'expired' THEN %(now)s - interval '6 minutes'
                   WHEN 'startup' THEN %(now)s - interval '2 hours'
                   WHEN 'lost' THEN %(now)s - interval '3 hours'
                   WHEN 'backstop' THEN %(now)s - interval '10 minutes'
                   WHEN 'stub' THEN %(now)s - interval '20 minutes'
                   WHEN 'bg_assigned' THEN %(now)s - interval '1 minute'
                   WHEN 'bg_pending' THEN %(now)s - interval '5 minutes'
                   WHEN 'bg_running' THEN %(now)s - interval '3 hours'
                   ELSE %(now)s - interval '30 days' + p.g * interval '1 second' END,
       CASE WHEN p.kind IN ('lost', 'bg_running') THEN %(now)s - interval '3 hours'
            WHEN p.kind = 'done' THEN %(now)s - interval '30 days' + p.g * interval '1 second' END,
       CASE WHEN p.kind = 'done' THEN %(now)s - interval '30 days' + p.g * interval '1 second'
                                      + interval '1 minute' END,
       CASE WHEN p.kind = 'done' THEN 0 END, '', 0,
       %(now)s - interval '30 days' + p.g * interval '1 second',
       %(now)s - interval '30 days' + p.g * interval '1 second'
FROM bench_plan p JOIN d ON d.g = p.g
ORDER BY p.g DESC  -- history first in the heap, as in a real table; the live rows are its newest
"""


@dataclass
class Case:
    size: int
    due_fraction: float
    due: int
    now: datetime
    load_seconds: float


def load(size: int, due_fraction: float, *, lost: int = 0) -> Case:
    from django.db import transaction
    from django.utils import timezone

    from gantry.core.models import Organization, RunnerGroup, RunSelector

    execute(
        "TRUNCATE run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, organization "
        "CASCADE"
    )
    due = lost or round(size * due_fraction / len(CATEGORIES)) * len(CATEGORIES)
    background = 3 * BACKGROUND_PER_KIND
    org = Organization.objects.create(slug="bench", name="bench", runs_per_hour_limit=1_000_000)
    group = RunnerGroup.objects.create(organization=org, name="bench", max_concurrent_runs=2_000_000_000)
    selector = RunSelector.objects.create(organization=org, selector={})
    now = timezone.now()
    params = {
        "n": size,
        "due": due,
        "bg": background,
        "stacks": due + background,
        "org": org.id,
        "group": group.id,
        "selector": selector.id,
        "now": now,
        "kinds": ["lost"] if lost else list(CATEGORIES),
    }
    t0 = time.perf_counter()
    with transaction.atomic():
        # Bulk-load mode for this transaction only: no FK checks, no NOTIFY or
        # runner-count triggers (the count is set below); rows are consistent
        # by construction.
        execute("SET LOCAL session_replication_role = replica")
        execute("SET LOCAL work_mem = '256MB'")
        execute(_PLAN_SQL, params)
        execute(_LOAD_SQL, params)
        execute("UPDATE runner_group SET runner_count = (SELECT count(*) FROM runner) WHERE id = %s", [group.id])
    execute("VACUUM (ANALYZE) run, runner, deployment, stack, runner_group")
    seconds = time.perf_counter() - t0
    print(f"  loaded {size:>9,} runs, {due:>7,} due, in {seconds:6.1f} s", flush=True)
    return Case(size=size, due_fraction=due_fraction, due=due, now=now, load_seconds=seconds)


# --------------------------------------------------------------------------- measuring


def _selections(now: datetime) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Each reaper's selection statements with their parameters, as the reaper builds them."""
    from gantry import conf
    from gantry.sql import reapers as reaper_sql

    cfg = conf.get()
    return {
        "expired_assignments": [(reaper_sql.EXPIRED_ASSIGNMENTS, {"now": now})],
        "inactive_runners": [
            (
                reaper_sql.SILENT_RUNNERS,
                {"silent_before": now - timedelta(seconds=cfg.runner_execution_timeout)},
            )
        ],
        "startup_deadline": [
            (
                reaper_sql.STARTUP_DEADLINE,
                {"now": now, "deadline": now - timedelta(seconds=cfg.runner_startup_deadline)},
            )
        ],
        "cancellation_backstop": [(reaper_sql.CANCELLATION_BACKSTOP, {"now": now})],
    }


def select_only(now: datetime, batch_size: int) -> dict[str, tuple[int, float]]:
    """Page through every due id of each reaper without acting: (ids, seconds)."""
    from gantry.reapers import reapers

    out = {}
    for name, statements in _selections(now).items():
        t0 = time.perf_counter()
        n = 0
        for sql, params in statements:
            n += sum(len(batch) for batch in reapers._due(sql, params, batch_size=batch_size, max_rows=10**9))
        out[name] = (n, time.perf_counter() - t0)
    return out


def tick(now: datetime, batch_size: int) -> dict[str, Any]:
    from gantry.reapers import reapers

    return {name: reapers.REAPERS[name](now=now, batch_size=batch_size, max_rows=10**9) for name in HANDLED}


def explain(now: datetime, batch_size: int) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of each reaper's first batch, rolled back (the statements lock and delete)."""
    from django.db import connection, transaction

    from gantry import conf
    from gantry.sql import reapers as reaper_sql

    first = {"after_key": datetime(1, 1, 1, tzinfo=UTC), "after_id": uuid.UUID(int=0), "limit": batch_size}
    statements = [(name, sql, {**params, **first}) for name, sts in _selections(now).items() for sql, params in sts]
    stubs = {"created_before": now - timedelta(seconds=conf.get().stub_cutoff), "now": now, **first}
    statements.append(("inactive_runners: the stub DELETE", reaper_sql.DELETE_STUBS, stubs))
    for name, sql, params in statements:
        print(f"\n--- EXPLAIN (ANALYZE, BUFFERS) {name}, first batch of {batch_size}")
        with contextlib.suppress(_Rollback), transaction.atomic(), connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
            for (line,) in cur.fetchall():
                print("   ", line)
            raise _Rollback


class _Rollback(Exception):
    pass


# What each reaper did to the rows that were due (the inactive reaper's two halves together).
HANDLED = {
    "expired_assignments": ("reset",),
    "inactive_runners": ("stub_deleted", "runner_lost"),
    "startup_deadline": ("timed_out",),
    "cancellation_backstop": ("cancelled",),
}
# Due rows per reaper, in fifths of the case's due rows (one fifth per loaded window).
DUE_FIFTHS = {"expired_assignments": 1, "inactive_runners": 2, "startup_deadline": 1, "cancellation_backstop": 1}


# --------------------------------------------------------------------------- lost runners

# A queued run behind each lost run, on its stack: the lane the reaper must promote.
_QUEUE_BEHIND_SQL = """
WITH l AS (
    SELECT run.id, run.stack_id, run.organization_id, run.selector_id FROM run
    JOIN runner ON runner.id = run.assigned_runner_id
    WHERE run.status = 'running' AND runner.status = 'busy' AND runner.last_seen_at < %(now)s - interval '1 hour'
),
d AS (
    INSERT INTO deployment (stack_id, status, created_by_id, spec, created_at, updated_at)
    SELECT stack_id, 'queued', NULL, '{}'::jsonb, %(now)s, %(now)s FROM l
    RETURNING id, stack_id
)
INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector, selector_id,
                 failure_reason, sealed_chunks, created_at, updated_at)
SELECT gen_random_uuid(), l.organization_id, d.stack_id, d.id, 1, 'queued', '{}'::jsonb, l.selector_id, '', 0,
       %(now)s, %(now)s
FROM d JOIN l ON l.stack_id = d.stack_id
RETURNING id
"""


def lost_tick(size: int, lost: int) -> dict[str, Any]:
    """One tick of the inactive reaper (default bounds) over ``lost`` runners lost at once in ``size`` runs."""
    from gantry.core.models import Run, Runner
    from gantry.logs import live
    from gantry.reapers import reapers

    case = load(size, 0.0, lost=lost)
    behind = execute(_QUEUE_BEHIND_SQL, {"now": case.now})
    lost_runs = [row[0] for row in execute(
        "SELECT run.id FROM run JOIN runner ON runner.id = run.assigned_runner_id "
        "WHERE run.status = 'running' AND runner.last_seen_at < %s", [case.now - timedelta(hours=1)])]  # fmt: skip
    assert len(lost_runs) == lost, len(lost_runs)
    t0 = time.perf_counter()
    data = gzip.compress(b"last words of a lost runner\n" * 40)
    for run_id in lost_runs:
        live.store(run_id, chunk_index=0, sealed_chunks=0, data=data)
    print(f"  {len(behind):,} queued runs behind, live records in {time.perf_counter() - t0:.1f} s", flush=True)
    execute("VACUUM (ANALYZE) run, runner, deployment")
    t0 = time.perf_counter()
    result = reapers.inactive_runners(now=case.now)
    seconds = time.perf_counter() - t0
    promoted = Run.objects.filter(id__in=[b[0] for b in behind], status="pending").count()
    flushed = Run.objects.filter(status="failure", log_manifest__isnull=False).count()
    busy_left = Runner.objects.filter(status="busy", last_seen_at__lt=case.now - timedelta(hours=1)).count()
    return {
        "size": size,
        "lost": lost,
        "seconds": seconds,
        "counts": dict(result.counts),
        "promoted": promoted,
        "flushed": flushed,
        "busy_left": busy_left,
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=SERVICES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000", help="run-table sizes (comma-separated)")
    parser.add_argument("--due", default="0.001,0.01", help="due fractions (comma-separated), e.g. 0.001,0.01,0.1")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--lost", type=int, default=0, help="instead: this many runners lost at once, one tick")
    parser.add_argument("--no-explain", action="store_true")
    parser.add_argument("--load-only", action="store_true", help="load the first case and stop (to experiment)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    fractions = [float(f) for f in args.due.split(",")]

    os.environ.setdefault("GANTRY_LOG_DIR", tempfile.mkdtemp(prefix="gantry-bench-logs-"))
    bootstrap(database_url(DEFAULT_DATABASE_URL))

    load_avg = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    version = execute("SHOW server_version")[0][0]
    print(f"PostgreSQL {version}; cpus={os.cpu_count()}, load average {load_avg}; batch {args.batch_size}")

    if args.lost:
        for size in sizes:
            r = lost_tick(size, args.lost)
            c = r["counts"]
            print(
                f"\n{r['size']:,} runs, {r['lost']:,} runners lost at once: one tick in {r['seconds']:.2f} s "
                f"({r['seconds'] * 1000 / r['lost']:.3f} ms per lost runner)"
            )
            print(
                f"  runner_lost={c.get('runner_lost', 0):,} runner_deleted={c.get('runner_deleted', 0):,} "
                f"skipped={c.get('skipped', 0)} flush_failed={c.get('flush_failed', 0)} error={c.get('error', 0)}; "
                f"logs flushed {r['flushed']:,}, lanes promoted {r['promoted']:,}, lost runners left {r['busy_left']}"
            )
            ok = r["busy_left"] == 0 and c.get("runner_lost") == r["lost"] and r["seconds"] < 15
            print(f"  target: all cleared in one tick of < 15 s: {'PASS' if ok else 'FAIL'}")  # fmt: skip
        return 0

    rows = []
    largest = (max(sizes), max(fractions))
    for size in sizes:
        for fraction in fractions:
            case = load(size, fraction)
            if args.load_only:
                print(f"  loaded as of {case.now.isoformat()}; stopping (--load-only)")
                return 0
            empty = tick(case.now - timedelta(hours=3), args.batch_size)
            assert all(r.acted == 0 for r in empty.values()), "the empty tick found due rows"
            selected = select_only(case.now, args.batch_size)
            if (size, fraction) == largest and not args.no_explain:
                explain(case.now, args.batch_size)
            t0 = time.perf_counter()
            swept = tick(case.now, args.batch_size)
            total = time.perf_counter() - t0
            for name in HANDLED:
                r = swept[name]
                due = case.due * DUE_FIFTHS[name] // len(CATEGORIES)
                handled = sum(r.counts[k] for k in HANDLED[name])
                assert handled == due, (name, due, dict(r.counts))
                rows.append((size, fraction, name, due, r.seconds, selected[name][1], empty[name].seconds))
            rows.append((size, fraction, "whole tick", case.due, total, None, sum(r.seconds for r in empty.values())))
            print(f"  swept in {total:6.1f} s", flush=True)

    print()
    head = (f"{'runs':>9} {'due %':>6} {'reaper':<22} {'due rows':>8} {'sweep s':>8} {'ms/due':>7} "
            f"{'select ms':>9} {'empty ms':>8}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for size, fraction, name, due, seconds, select_s, empty_s in rows:
        per = f"{seconds * 1000 / due:7.2f}" if due else "      -"
        select = f"{select_s * 1000:9.1f}" if select_s is not None else ""
        print(f"{size:>9,} {fraction * 100:>6.2f} {name:<22} {due:>8,} {seconds:>8.2f} {per} {select:>9} "
              f"{empty_s * 1000:>8.1f}")  # fmt: skip
    print("\nselect ms: paging through the due ids alone (the inactive reaper: its busy runners; its stubs are")
    print("deleted by the selecting statement itself). empty ms: the same reaper when nothing is due yet.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
