"""Benchmark: the queue read (GET /orgs/{org}/queue) at a large backlog. Not a test; prints a table.

    .venv/bin/python -m tests.bench.queue_read [--backlog 100000] [--page 500] [--repeat 30] [--sizes 10,10000]

First, for each of ``--sizes`` waiting runs (an org of its own each, one
pending run per stack and nine queued behind, priorities mixed), the
statements and the time of one ``queue.read_queue`` of a page (positions and
expected starts included): the count must not grow with the backlog. Then it
builds one org whose backlog is ``--backlog`` waiting runs (one pending run per
stack, nine queued behind each; a tenth of the stacks on a selector no group
serves; priorities mixed), two runner groups, then times ``queue.read_queue``
for the first page and for a page deep in the backlog (through its cursor), and
the whole HTTP request through Django's test client. Uses exactly the database
``DATABASE_URL`` names (default ``gantry_bench_queue`` on 127.0.0.1), which it
fills and leaves (one holding a superuser is refused), and a Redis database of
its own (tests/bench/common.py; ``--help``).
"""

from __future__ import annotations

import argparse
import functools
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
    parser.add_argument("--sizes", default="10,10000", help="waiting runs of the statement-count orgs")
    args = parser.parse_args(argv)
    bootstrap(database_url("postgres://postgres@127.0.0.1:5432/gantry_bench_queue"))

    from django.contrib.auth.models import User
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone
    from rest_framework.test import APIClient

    from gantry.core import services
    from gantry.core.models import Membership, Organization, Role, Run
    from gantry.dispatch import queue
    from tests.queue.helpers import bulk_backlog

    def mix_priorities(org: Organization) -> None:
        # low, normal and high in about equal parts, the same on every run of the benchmark.
        execute(f"UPDATE run SET priority = abs(hashtext(id::text)) % 3 WHERE organization_id = {int(org.id)}")

    def org_of(slug: str, backlog: int) -> Organization:
        """The org ``slug`` holding ``backlog`` waiting runs on one linux group (made again if it holds others)."""
        org = Organization.objects.filter(slug=slug).first()
        if org is not None and Run.objects.filter(organization=org).count() == backlog:
            return org
        if org is not None:
            oid = int(org.id)
            execute(
                f"DELETE FROM run_event WHERE run_id IN (SELECT id FROM run WHERE organization_id = {oid});"
                f"DELETE FROM run WHERE organization_id = {oid};"
                f"DELETE FROM deployment WHERE stack_id IN (SELECT id FROM stack WHERE organization_id = {oid});"
                f"DELETE FROM stack WHERE organization_id = {oid}"
            )
            org.delete()
        org = services.org_create(slug=slug, name=slug)
        services.runner_group_create(org=org, name="linux", labels={"os": "linux"}, max_concurrent_runs=50)
        bulk_backlog(org, stacks=max(1, backlog // 10), queued_per_stack=9, selector={"os": "linux"})
        mix_priorities(org)
        return org

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
        mix_priorities(org)
        execute("VACUUM ANALYZE run")  # the priorities mixed by an UPDATE: as autovacuum would leave it
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

    def read_page(org: Organization) -> None:
        queue.read_queue(org=org, now=timezone.now(), limit=args.page)

    sized = []
    for size in (int(n) for n in args.sizes.split(",")):
        small = org_of(f"bench-{size}", size)
        execute("VACUUM ANALYZE run")  # the priorities mixed by an UPDATE: as autovacuum would leave it
        with CaptureQueriesContext(connection) as queries:
            page = queue.read_queue(org=small, now=timezone.now(), limit=args.page)
        placed = sum(1 for e in page.entries if e.position is not None)
        ms = sorted(timed(functools.partial(read_page, small)))
        sized.append((size, len(queries), len(page.entries), placed, statistics.median(ms), ms[0]))

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
    print(f"\nqueue read statements: one read_queue of a page of {args.page} (priorities mixed), {args.repeat} repeats")
    print(f"{'waiting runs':>12} {'statements':>11} {'entries':>8} {'placed':>7} {'median ms':>10} {'min ms':>8}")
    for size, statements, shown, placed, median, fastest in sized:
        print(f"{size:>12} {statements:>11} {shown:>8} {placed:>7} {median:>10.1f} {fastest:>8.1f}")
    print(f"\nqueue read: {waiting} waiting runs, pages of {args.page}, {args.repeat} repeats")
    print(f"{'what':<34} {'median ms':>10} {'p95 ms':>8} {'min ms':>8}")
    for name, ms in rows:
        ms.sort()
        print(f"{name:<34} {statistics.median(ms):>10.1f} {ms[int(len(ms) * 0.95) - 1]:>8.1f} {ms[0]:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
