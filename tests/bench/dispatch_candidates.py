"""The backend dispatcher's candidate query at growing backlogs: its cost follows the candidates, not the queue.

``python -m tests.bench.dispatch_candidates [--sizes 1000,100000,1000000]``

One heavy org holds the backlog (``--sizes``; 99% of it with a selector its
github_actions group cannot serve, the adversarial shape of
``poll_claim``), and 49 light orgs hold 5 servable runs each, every org
with one github_actions group. Each round times ``list_candidates`` (the
statement the dispatcher runs at the start of every tick) with the default
batch of 100, and once more with the heavy org at its in-flight cap. It
uses exactly the database ``DATABASE_URL`` names (default
``gantry_bench_dispatch`` on 127.0.0.1), whose Gantry tables it TRUNCATEs, and
a Redis database of its own (tests/bench/common.py; ``--help``).
Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_dispatch"
LIGHT_ORGS = 49
LIGHT_RUNS = 5
CALLS = 30


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def load(size: int) -> int:
    """A fresh set of orgs: the heavy one with ``size`` pending runs; answers the heavy org's id."""
    from django.utils import timezone

    from gantry.core.models import GroupKind, Organization, RunnerGroup, RunSelector
    from tests.bench.poll_claim import _LOAD_SQL

    execute(
        "TRUNCATE run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, organization "
        "CASCADE"
    )
    base = timezone.now() - timedelta(days=1)
    heavy = 0
    for i in range(LIGHT_ORGS + 1):
        org = Organization.objects.create(slug=f"o{i}", name=f"org {i}", runs_per_hour_limit=1_000_000)
        RunnerGroup.objects.create(
            organization=org, name="actions", kind=GroupKind.GITHUB_ACTIONS, labels={"ci": "github"},
            max_concurrent_runs=100_000, github_owner="o", github_repo="r", github_workflow="w.yml",
            github_ref="main",
        )  # fmt: skip
        match = RunSelector.objects.create(organization=org, selector={"ci": "github"}).id
        other = RunSelector.objects.create(organization=org, selector={"os": "mac"}).id
        n = size if i == 0 else LIGHT_RUNS
        pool = max(1, n // 100) if i == 0 else n
        execute(_LOAD_SQL, {"org": org.id, "n": n, "n_other": n - pool, "other": [other], "match": [match],
                            "base": base})  # fmt: skip
        if i == 0:
            heavy = org.id
    execute("VACUUM (ANALYZE) run, run_selector, runner_group, organization")
    return heavy


def timed(limit: int) -> tuple[float, float, int]:
    from django.utils import timezone

    from gantry.dispatch.candidates import list_candidates

    samples, found = [], 0
    for _ in range(CALLS):
        t0 = time.perf_counter()
        found = len(list_candidates(now=timezone.now(), limit=limit))
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1], found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.dispatch_candidates",
        epilog=SERVICES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=_ints, default=[1_000, 100_000])
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)
    bootstrap(database_url(DEFAULT_DATABASE_URL))
    from gantry.core.models import Organization

    print(f"{'backlog':>10} {'heavy org':<14} {'candidates':>10} {'p50 ms':>8} {'p95 ms':>8}")
    for size in args.sizes:
        heavy = load(size)
        for state in ("under its cap", "at its cap"):
            if state == "at its cap":
                Organization.objects.filter(id=heavy).update(max_in_flight=0)
            p50, p95, found = timed(args.batch)
            print(f"{size:>10,} {state:<14} {found:>10} {p50:>8.2f} {p95:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
