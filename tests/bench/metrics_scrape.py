"""Benchmark: what one /metrics scrape costs the database, by org count, with and without the scrape cache.

    .venv/bin/python -m tests.bench.metrics_scrape [--orgs 1,30,300] [--repeat 20]

For each org count (each org: one runner group, one stack with a pending run)
it scrapes ``/metrics`` through Django's test client from loopback and
prints the statements one scrape runs and its median time, first with
``GANTRY_METRICS_CACHE_SECONDS=0`` (every scrape computes) and then with the
default 5 s (scrapes within the period share one computation). Uses exactly
the database ``DATABASE_URL`` names (default ``gantry_bench_metrics`` on
127.0.0.1), which it fills and leaves, and a Redis database of its own
(tests/bench/common.py; ``--help``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from tests.bench.common import SERVICES_HELP, bootstrap, database_url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=SERVICES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--orgs", default="1,30,300", help="org counts, comma-separated, ascending")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    bootstrap(database_url("postgres://postgres@127.0.0.1:5432/gantry_bench_metrics"))

    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from gantry import conf, metrics
    from gantry.core import services
    from gantry.core.models import Organization

    def scrape() -> tuple[int, float]:
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1")
            seconds = time.perf_counter() - started
        assert response.status_code == 200, response.status_code
        return len(queries.captured_queries), seconds

    print(f"{'orgs':>6} {'cache':>6} {'statements':>11} {'median ms':>10} {'p90 ms':>8}")
    for count in sorted(int(n) for n in args.orgs.split(",")):
        for i in range(Organization.objects.filter(slug__startswith="bench-").count(), count):
            org = services.org_create(slug=f"bench-{i}", name=f"Bench {i}")
            services.runner_group_create(org=org, name="linux", labels={"os": "linux"})
            stack = services.stack_create(org=org, name="app", labels={"gantry:runner-group:os": "linux"},
                                          spec={"steps": [{"name": "x", "run": "true"}]})  # fmt: skip
            services.deployment_create(stack=stack)
        for cache in ("0", "5"):
            os.environ["GANTRY_METRICS_CACHE_SECONDS"] = cache
            conf.get.cache_clear()
            metrics.ScrapeMemo.clear_all()
            runs = [scrape() for _ in range(args.repeat)]
            statements = statistics.median(n for n, _ in runs)
            times = sorted(s for _, s in runs)
            p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
            print(f"{count:>6} {cache + ' s':>6} {statements:>11g} {statistics.median(times) * 1000:>10.2f} "
                  f"{p90 * 1000:>8.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
