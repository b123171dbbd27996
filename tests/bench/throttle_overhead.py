"""What the dispatch throttle costs: the Redis check alone, and a claim with the throttle on vs off.

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.throttle_overhead [--calls 1000] [--backlog 300] [--rounds 10]

``DATABASE_URL`` names the database, exactly (default
``postgres://postgres@127.0.0.1:5432/gantry_bench_throttle``); it is created when
missing and migrated; its Gantry tables are TRUNCATEd (one holding a superuser
is refused). Redis is a database of the bench's own on ``REDIS_URL``'s server,
four above its database unless ``GANTRY_REDIS_DB`` says (tests/bench/common.py):
the bench deletes every throttle bucket there, so never the configured one. A
measurement, not a test: it exits 0 either way.

1. The bucket check: ``--calls`` calls each of ``throttle.take`` (EVALSHA,
   one round trip), ``throttle.peek`` and ``throttle.consume`` (the claim's
   policy wrapper), one connection, timed per call; then ``consume`` with
   5 ms idle between calls, closer to how the claim uses it.
2. The claim: one org (a rate high enough never to throttle), one group, a
   backlog of ``--backlog`` pending runs, claimed one ``claim()`` at a time
   with the throttle on and off (``GANTRY_RATE_LIMIT_ENABLED``) on alternate
   claims, so both sides see the same background load on a shared machine
   and the same table state. Between rounds, untimed, the stubs are deleted
   and the runs put back to pending.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from tests.bench.common import SERVICES_HELP, bootstrap, database_url

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_throttle"


def _bootstrap() -> None:
    os.environ.setdefault("GANTRY_LOG_LEVEL", "ERROR")
    bootstrap(database_url(DEFAULT_DATABASE_URL))


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _line(label: str, seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"  {label:<34} n={len(ms):>5}  p50 {_pct(ms, 0.5):7.3f} ms  p99 {_pct(ms, 0.99):7.3f} ms  "
        f"mean {statistics.fmean(ms):7.3f} ms"
    )


def bench_bucket(calls: int) -> None:
    from gantry.dispatch import throttle
    from tests.throttle.helpers import clear_buckets

    clear_buckets()
    org = 990_000
    rate = 10_000_000  # never empties during the run
    for name, fn in (
        ("take (EVALSHA, writes)", lambda: throttle.take(organization_id=org, rate=rate)),
        ("peek (EVALSHA, read-only)", lambda: throttle.peek(organization_id=org, rate=rate)),
        ("consume (the claim's policy call)", lambda: throttle.consume(organization_id=org, rate=rate)),
    ):
        fn()  # warm: connection, script load
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        print(_line(name, samples))
    # A poll path calls Redis once per claim, not in a tight loop: with the
    # Redis process idle in between, each call also pays its wake-up.
    samples = []
    for _ in range(calls):
        time.sleep(0.005)
        t0 = time.perf_counter()
        throttle.consume(organization_id=org, rate=rate)
        samples.append(time.perf_counter() - t0)
    print(_line("consume, 5 ms idle between calls", samples))
    clear_buckets()


def bench_claim(backlog: int, rounds: int) -> None:
    from django.db import connection, transaction

    from gantry import conf
    from gantry.core import services
    from gantry.dispatch.claim import claim
    from tests.conftest import SPEC
    from tests.throttle.helpers import clear_buckets

    with connection.cursor() as cur:
        cur.execute(
            "TRUNCATE run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, "
            "organization CASCADE"
        )
    org = services.org_create(slug="bench-throttle", name="bench")
    services.org_set_runs_per_hour_limit(org=org, limit=1_000_000)  # burst 24M: never throttles here
    group, _ = services.runner_group_create(org=org, name="g", labels={"os": "linux"}, max_concurrent_runs=100_000)
    t0 = time.perf_counter()
    for i in range(backlog):
        stack = services.stack_create(org=org, name=f"s{i}", labels={"gantry:runner-group:os": "linux"}, spec=SPEC)
        services.deployment_create(stack=stack)
    print(f"  loaded {backlog} pending runs in {time.perf_counter() - t0:.1f} s")
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE run")

    def refill() -> None:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("DELETE FROM runner WHERE runner_group_id = %s", [group.id])  # FK nulls the pointer
            cur.execute(
                "UPDATE run SET status = 'pending', assigned_at = NULL, assigned_expires_at = NULL "
                "WHERE organization_id = %s",
                [org.id],
            )

    samples: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for i in range(backlog):
            # Claims alternate on / off, so both sides see the same load and table state.
            enabled = i % 2 == 0
            os.environ["GANTRY_RATE_LIMIT_ENABLED"] = "true" if enabled else "false"
            conf.get.cache_clear()
            t0 = time.perf_counter()
            got = claim(group=group)
            samples[enabled].append(time.perf_counter() - t0)
            assert got is not None, "a claim came back empty: the bench measures nothing"
        refill()
    clear_buckets()
    on, off = samples[True], samples[False]
    print(_line("claim, throttle on", on))
    print(_line("claim, throttle off", off))
    print(
        f"  difference at p50: {(_pct(on, 0.5) - _pct(off, 0.5)) * 1000:+.3f} ms "
        f"({_pct(on, 0.5) / _pct(off, 0.5):.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog=SERVICES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--backlog", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    _bootstrap()
    from django.conf import settings

    print(f"Redis {settings.REDIS_URL}, database {settings.DATABASES['default']['NAME']}, cpus={os.cpu_count()}")
    print(f"load average now {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("bucket check, one connection:")
    bench_bucket(args.calls)
    print(f"claim, {args.rounds} rounds of {args.backlog} claims, throttle on / off on alternate claims:")
    bench_claim(args.backlog, args.rounds)


if __name__ == "__main__":
    main()
