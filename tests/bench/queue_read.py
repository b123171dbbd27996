"""Benchmark: the queue read (GET /orgs/{org}/queue) at a large backlog. Not a test; prints a table.

    .venv/bin/python -m tests.bench.queue_read [--backlog 100000] [--page 500] [--repeat 30]

Builds one org whose backlog is ``--backlog`` waiting runs (one pending run per
stack, nine queued behind each; a tenth of the stacks on a selector no group
serves), two runner groups, then times ``queue.read_queue`` for the first page
and for a page deep in the backlog (through its cursor), and the whole HTTP
request through Django's test client. Uses exactly the database
``DATABASE_URL`` names (default ``gantry_bench_queue`` on 127.0.0.1), which it
fills and leaves (one holding a superuser is refused), and a Redis database of
its own (tests/bench/common.py; ``--help``).
"""

from __future__ import annotations

import argparse
import statistics
import time

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=SERVICES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    bootstrap(database_url("postgres://postgres@127.0.0.1:5432/gantry_bench_queue"))

    from django.contrib.auth.models import User
    from django.utils import timezone
    from rest_framework.test import APIClient

    from gantry.core import services
    from gantry.core.models import Membership, Organization, Role, Run
    from gantry.dispatch import queue
    from tests.queue.helpers import bulk_backlog

    org = Organization.objects.filter(slug="bench").first()
    if org is None or Run.objects.filter(organization=org).count() != args.backlog:
        if org is not None:
            execute("DELETE FROM run_event; DELETE FROM run; DELETE FROM deployment; DELETE FROM stack")
            org.delete()
        org = services.org_create(slug="bench", name="Bench")
        services.runner_group_create(org=org, name="linux", labels={"os": "linux"}, max_concurrent_runs=50)
        services.runner_group_create(org=org, name="mac", labels={"os": "macos"})
        stacks = args.backlog // 10
        bulk_backlog(org, stacks=stacks - stacks // 10, queued_per_stack=9, selector={"os": "linux"})
        bulk_backlog(org, stacks=stacks // 10, queued_per_stack=9, selector={"os": "plan9"}, prefix="nowhere")
        execute("ANALYZE run")
    user, _ = User.objects.get_or_create(username="bench")
    Membership.objects.get_or_create(user=user, organization=org, defaults={"role": Role.ADMIN})
    client = APIClient()
    client.force_authenticate(user)

    def timed(fn: object) -> list[float]:
        out = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fn()  # type: ignore[operator]
            out.append((time.perf_counter() - start) * 1000)
        return out

    first = queue.read_queue(org=org, now=timezone.now(), limit=args.page)
    deep_cursor = first.next_cursor
    for _ in range(args.backlog // args.page // 2):  # half way into the backlog
        deep_cursor = queue.read_queue(org=org, now=timezone.now(), cursor=deep_cursor, limit=args.page).next_cursor
    rows = [
        ("read_queue, first page", timed(lambda: queue.read_queue(org=org, now=timezone.now(), limit=args.page))),
        (
            "read_queue, page half way in",
            timed(lambda: queue.read_queue(org=org, now=timezone.now(), cursor=deep_cursor, limit=args.page)),
        ),
        ("GET /orgs/bench/queue?limit=N", timed(lambda: client.get(f"/api/v1/orgs/bench/queue?limit={args.page}"))),
    ]
    waiting = Run.objects.filter(organization=org).count()
    print(f"\nqueue read: {waiting} waiting runs, pages of {args.page}, {args.repeat} repeats")
    print(f"{'what':<34} {'median ms':>10} {'p95 ms':>8} {'min ms':>8}")
    for name, ms in rows:
        ms.sort()
        print(f"{name:<34} {statistics.median(ms):>10.1f} {ms[int(len(ms) * 0.95) - 1]:>8.1f} {ms[0]:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
