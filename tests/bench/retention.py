"""Retention benchmark: ticks of the retention reaper over a big table of finished runs, some past retention.

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.retention [--size 1000000] [--past 0.1] [--chunks-every 10]

The database is exactly the one ``DATABASE_URL`` names (default
``postgres://postgres@127.0.0.1:5432/gantry_bench_retention``), created when
missing, migrated, and its Gantry tables TRUNCATEd: name a scratch database
(one holding a superuser is refused). The retention cursor lives in a Redis
database of the bench's own on ``REDIS_URL``'s server (tests/bench/common.py),
never the configured one. A measurement, not a test: it prints figures and
exits 0.

The load (set-based, triggers off): ``--size`` finished runs in deployments
of two attempts each (a failed first attempt, then its retry, the newest),
two run_events per run, finished evenly over the last 33⅓ days, so the
oldest ``--past`` fraction finished more than 30 days ago
(``GANTRY_RETENTION_DAYS``' default). Of those, the first attempts are due
for removal and the retries are kept (a deployment's newest run). Every
``--chunks-every``-th due run has a log chunk in the local store (a temporary
folder), so the sweep deletes real files; every due run, having started,
goes through the log-purge outbox.

Then: one empty tick (as of 10 days earlier, nothing past retention), and
ticks as of the load instant, with the default bounds
(``GANTRY_RETENTION_BATCH_SIZE``, ``GANTRY_RETENTION_MAX_ROWS``), until a
tick removes nothing. Each tick's time and counts are printed; then the
table's state is checked (every due run gone with its events and chunks,
every kept run still there).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_retention"
STACKS = 1000

_LOAD_SQL = """
WITH s AS (
    INSERT INTO stack (organization_id, name, labels, spec, secrets, created_at)
    SELECT %(org)s, 'r-' || k, '{}'::jsonb, NULL, '{}'::jsonb, %(now)s - interval '40 days'
    FROM generate_series(1, %(stacks)s) k
    RETURNING id, split_part(name, '-', 2)::int AS rank
),
d AS (
    INSERT INTO deployment (stack_id, status, created_by_id, spec, created_at, updated_at)
    SELECT s.id, 'succeeded', NULL, jsonb_build_object('k', k), %(now)s - interval '40 days', %(now)s
    FROM generate_series(1, %(deployments)s) k JOIN s ON s.rank = 1 + (k - 1) %% %(stacks)s
    RETURNING id, stack_id, (spec->>'k')::int AS k
),
r AS (
    INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector, selector_id,
                     first_pending_at, started_at, finished_at, exit_code, failure_reason, sealed_chunks,
                     created_at, updated_at)
    SELECT gen_random_uuid(), %(org)s, d.stack_id, d.id, a,
           CASE a WHEN 1 THEN 'failure' ELSE 'succeeded' END, '{}'::jsonb, %(selector)s,
           f - interval '2 minutes', f - interval '1 minute', f, CASE a WHEN 1 THEN 1 ELSE 0 END, '', 0,
           f - interval '2 minutes', f
    FROM d CROSS JOIN generate_series(1, 2) a
    CROSS JOIN LATERAL (
        SELECT %(now)s - %(span)s * (1 - ((2 * d.k + a - 2)::float8 / %(size)s)) AS f
    ) t
    ORDER BY 2 * d.k + a
    RETURNING id, finished_at
)
INSERT INTO run_event (run_id, at, kind, detail)
SELECT r.id, r.finished_at - interval '1 minute' * e, CASE e WHEN 1 THEN 'finished' ELSE 'created' END, '{}'::jsonb
FROM r CROSS JOIN generate_series(1, 2) e
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=SERVICES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=1_000_000, help="finished runs (two per deployment)")
    parser.add_argument("--past", type=float, default=0.1, help="fraction finished past retention")
    parser.add_argument("--chunks-every", type=int, default=10, help="every n-th due run has a stored chunk")
    args = parser.parse_args(argv)

    log_dir = tempfile.mkdtemp(prefix="gantry-bench-retention-")
    os.environ["GANTRY_LOG_DIR"] = log_dir
    os.environ["GANTRY_S3_BUCKET"] = ""
    bootstrap(database_url(DEFAULT_DATABASE_URL))

    from django.db import transaction
    from django.utils import timezone

    from gantry import conf
    from gantry.core.models import Organization, RunSelector
    from gantry.logs.storage import get_storage
    from gantry.reapers import reapers, retention
    from gantry.redis import client as redis_client

    cfg = conf.get()
    load_avg = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"PostgreSQL {execute('SHOW server_version')[0][0]}; cpus={os.cpu_count()}, load average {load_avg}")
    print(f"retention {cfg.retention_days} days, batch {cfg.retention_batch_size}, max {cfg.retention_max_rows}/tick")

    execute("TRUNCATE log_purge, run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, "
            "organization CASCADE")  # fmt: skip
    org = Organization.objects.create(slug="bench", name="bench")
    selector = RunSelector.objects.create(organization=org, selector={})
    now = timezone.now()
    # Finished evenly over span: the oldest `past` fraction is older than the retention.
    span = timedelta(days=cfg.retention_days) / (1 - args.past)
    size = args.size // 2 * 2
    t0 = time.perf_counter()
    with transaction.atomic():
        execute("SET LOCAL session_replication_role = replica")
        execute("SET LOCAL work_mem = '256MB'")
        execute(_LOAD_SQL, {"org": org.id, "selector": selector.id, "now": now, "stacks": STACKS,
                            "deployments": size // 2, "size": size, "span": span})  # fmt: skip
    execute("VACUUM (ANALYZE) run, run_event, deployment")
    cutoff = now - timedelta(days=cfg.retention_days)
    due = [r[0] for r in execute("SELECT id FROM run WHERE finished_at < %s AND attempt = 1", [cutoff])]
    kept = execute("SELECT count(*) FROM run WHERE finished_at < %s AND attempt = 2", [cutoff])[0][0]
    storage = get_storage()
    chunk = gzip.compress(b"an old log line\n" * 100)
    with_chunks = due[:: args.chunks_every]
    for run_id in with_chunks:
        storage.put(run_id, 0, chunk)
    print(f"loaded {size:,} finished runs, {2 * size:,} events in {time.perf_counter() - t0:.1f} s; "
          f"past retention: {len(due):,} due (first attempts, {len(with_chunks):,} with a stored chunk), "
          f"{kept:,} kept (newest attempts)", flush=True)  # fmt: skip
    redis_client().delete(retention._cursor_key())

    empty = reapers.retention(now=now - timedelta(days=10))
    print(f"\nempty tick (nothing past retention): {empty.seconds * 1000:.1f} ms, {dict(empty.counts)}")
    redis_client().delete(retention._cursor_key())

    print(f"\n{'tick':>4} {'seconds':>8} {'runs del':>9} {'events del':>10} {'logs purged':>11} {'ms/run del':>10}")
    ticks = []
    while True:
        r = reapers.retention(now=now)
        ticks.append(r)
        deleted = r.counts["run_deleted"]
        per = f"{r.seconds * 1000 / deleted:10.3f}" if deleted else "         -"
        print(f"{len(ticks):>4} {r.seconds:8.2f} {deleted:>9,} {r.counts['event_deleted']:>10,} "
              f"{r.counts['log_purged']:>11,} {per}", flush=True)  # fmt: skip
        if (not deleted and len(ticks) > 1) or len(ticks) > 1000:
            break
    total_deleted = sum(t.counts["run_deleted"] for t in ticks)
    worst = max(t.seconds for t in ticks)
    busy = [t for t in ticks if t.counts["run_deleted"]]
    median = sorted(t.seconds for t in busy)[len(busy) // 2] if busy else 0.0
    left_due = execute("SELECT count(*) FROM run WHERE id = ANY(%s::uuid[])", [due])[0][0]
    left_events = execute("SELECT count(*) FROM run_event WHERE run_id = ANY(%s::uuid[])", [due])[0][0]
    left_kept = execute("SELECT count(*) FROM run WHERE finished_at < %s AND attempt = 2", [cutoff])[0][0]
    left_files = sum(1 for run_id in with_chunks if (Path(log_dir) / "runs" / str(run_id)).exists())
    outbox = execute("SELECT count(*) FROM log_purge")[0][0]
    print(f"\n{total_deleted:,} runs removed in {len(busy)} ticks (then {len(ticks) - len(busy)} with nothing left); "
          f"per tick: median {median:.2f} s, worst {worst:.2f} s; "
          f"{sum(t.seconds for t in busy) * 1000 / max(1, total_deleted):.3f} ms per removed run")  # fmt: skip
    print(f"left: due runs {left_due}, their events {left_events}, their chunk folders {left_files}, outbox {outbox}; "
          f"kept newest runs {left_kept:,} of {kept:,}")  # fmt: skip
    ok = left_due == left_events == left_files == outbox == 0 and left_kept == kept
    print(f"state after the sweep: {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
