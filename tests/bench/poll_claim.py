"""Poll-claim benchmark: the real ``gantry.dispatch.claim.claim()`` against big pending backlogs.

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.poll_claim [--sizes 1000,100000,1000000] [--seconds 10] [--pollers 1,8]
                                     [--shapes all,adversarial] [--matching-selectors 4] [--no-variants]
                                     [--priorities single|mixed]

``DATABASE_URL`` names the database, exactly (default
``postgres://postgres@127.0.0.1:5432/gantry_bench``); it is created when missing
and migrated. Its Gantry tables are TRUNCATEd at the start: name a scratch
database (one holding a superuser is refused). Redis (the throttle's buckets;
the bench's orgs have a budget they never exhaust, so every won claim makes its
Redis call and none is refused) is a database of the bench's own on
``REDIS_URL``'s server, four above its database unless ``GANTRY_REDIS_DB``
says (tests/bench/common.py). A full run takes 20-30 minutes. Results and their reading are in
docs/performance.md. It is a measurement, not a test: it exits 0 either way.

What it does:

1. Loads, for every size N and shape, a fresh org with one polling group and
   N pending runs, with set-based SQL (one INSERT ... SELECT over
   ``generate_series`` writes the stacks, deployments and runs; one stack and
   one deployment per run, because a stack holds at most one live run; run's
   secondary indexes, ``run_claim_order_idx`` among them, are dropped for
   the load and rebuilt once from their own definitions), then VACUUM
   ANALYZE. Shapes: ``all`` — every run matches the group;
   ``adversarial`` — the oldest 99% carry selectors the group lacks (16
   distinct ones), the newest 1% match. Matching runs are spread over
   ``--matching-selectors`` selectors the group satisfies. Priorities
   (``--priorities``): ``single`` — every run normal, one millisecond apart
   from a day ago (all aged to high: one slice per selector holds the work);
   ``mixed`` — low, normal, high by age rank modulo 3, in the matching pool
   and in the non-matching 99% alike, and the matching pool's
   ``first_pending_at`` spread evenly over the last three aging windows
   (three times GANTRY_PRIORITY_AGING_SECONDS), so its oldest low runs rank high,
   the next ones a level up, the newest as queued: every (selector,
   priority) slice of ``run_claim_order_idx`` is probed and holds work.
2. Claims through ``claim(group=...)`` with 1 and 8 concurrent pollers
   (threads, one Django connection each, all polling the case's one group),
   ``--seconds`` of timed claims per case, timing every call with
   ``time.perf_counter``. Claims consume the matching pool (10 runs at 1k
   adversarial), so they run in batches of at most "matching runs left"
   attempts; between batches, outside the timed region, the group's stub
   runners are deleted and the claimed runs set back to pending
   (``first_pending_at`` and ``priority`` kept). Since a batch never
   attempts more claims than there are matching runs, a ``None`` is an empty
   answer while work existed;
   each is confirmed by counting claimable matching runs and reported as a
   false empty.
3. Measures the floor on the same database: ``UPDATE bench_floor SET n = n + 1
   WHERE id = k`` in autocommit through the same Django cursor path, with as
   many threads as pollers (8 threads on 8 rows). Floor slices alternate with
   claim slices, and the slices rotate over all cases and claim variants, so
   sizes, variants and the floor compare with each other even while other
   work shares the machine. CPU time per call is recorded on both sides of the connection
   (polling threads, and their PostgreSQL backends via /proc) as a
   load-independent figure.
4. Measures the same way three variants (labelled "variant: ..."; not the
   code under test): claim()'s prepared statement in other transaction
   shapes — a commit that waits for the WAL flush, BEGIN as a round trip of
   its own (claim.py before P4), and the token taken after an autocommitted
   statement (P3) — to size the choices docs/performance.md discusses.
5. Prints the table, the three targets with PASS/FAIL, and EXPLAIN (ANALYZE,
   BUFFERS) of the claim's cached plan at the largest adversarial backlog
   (rolled back), and how that plan reads the run table (the indexes, and
   whether it scans it: ``run_claim_order_idx`` for the probes and
   ``run_pkey`` for the lock are the intended plan).

The run table is vacuumed before each rotation (as an autovacuum pass would);
dead tuples made by the rotation's claims stay for the rest of it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute

if TYPE_CHECKING:
    from gantry.core.models import RunnerGroup

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench"

# The polling group's labels; MATCHING selectors are all contained in them.
GROUP_LABELS: dict[str, str] = {"os": "linux", "arch": "x64", "pool": "bench"}
MATCHING: list[dict[str, str]] = [
    {"os": "linux"},
    {"arch": "x64"},
    {"os": "linux", "arch": "x64"},
    {"os": "linux", "pool": "bench"},
    {"arch": "x64", "pool": "bench"},
    {"os": "linux", "arch": "x64", "pool": "bench"},
]
# The adversarial backlog's selectors: none is contained in GROUP_LABELS.
NON_MATCHING: list[dict[str, str]] = [{"os": "mac", "v": f"k{i}"} for i in range(16)]
SHAPES = ("all", "adversarial")
# --priorities: the pattern of run priorities (Priority values) the loader deals out by age rank.
PRIORITY_PATTERNS: dict[str, list[int]] = {"single": [1], "mixed": [0, 1, 2]}
# mixed: the matching pool's first_pending_at spans this many aging windows (GANTRY_PRIORITY_AGING_SECONDS),
# so its oldest low runs rank high, its middle ones a level up, its newest as queued.
AGING_WINDOWS_SPANNED = 3
# A group that never fills: stub runners pile up (one per claim) during a round.
HUGE_CAPACITY = 2_000_000_000
BENCH_RUNS_PER_HOUR = 100_000_000
FLOOR_ROWS = 8
# Claim slices and floor slices alternate, so both see the same background load.
SLICE = 1.0
FLOOR_SLICE = 0.5

TARGET_LATENCY_GROWTH = 1.3  # (i) p50 at the largest adversarial backlog ≤ 1.3 times p50 at the smallest (issue 25)
TARGET_FLOOR_RATIO = 0.30  # (ii) single-poller claims/s ≥ 30% of the bare-UPDATE floor

# --------------------------------------------------------------------------- setup


def _server_notes() -> list[str]:
    settings = (
        "shared_buffers",
        "effective_cache_size",
        "work_mem",
        "random_page_cost",
        "synchronous_commit",
        "fsync",
        "jit",
        "plan_cache_mode",
        "max_connections",
    )
    version = execute("SHOW server_version")[0][0]
    values = ", ".join(f"{s}={execute(f'SHOW {s}')[0][0]}" for s in settings)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [f"PostgreSQL {version}; {values}", f"cpus={os.cpu_count()}, load average now {load}"]


# --------------------------------------------------------------------------- loading


@dataclass
class Case:
    size: int
    shape: str
    group: RunnerGroup
    matching_ids: list[int]
    pool: int  # pending runs the group can take


_LOAD_SQL = """
WITH s AS (
    INSERT INTO stack (organization_id, name, labels, spec, secrets, created_at)
    SELECT %(org)s, 'b-' || g, '{}'::jsonb, NULL, '{}'::jsonb, %(base)s
    FROM generate_series(1, %(n)s) g
    RETURNING id, name
),
d AS (
    INSERT INTO deployment (stack_id, status, created_by_id, spec, created_at, updated_at)
    SELECT s.id, 'queued', NULL, '{}'::jsonb, %(base)s, %(base)s FROM s
    RETURNING id, stack_id
),
numbered AS (
    -- g is the run's age rank: 1 is the oldest pending run.
    SELECT d.id AS deployment_id, d.stack_id, split_part(s.name, '-', 2)::int AS g
    FROM d JOIN s ON s.id = d.stack_id
),
chosen AS (
    SELECT n.*, CASE
        WHEN n.g <= %(n_other)s THEN (%(other)s::bigint[])[1 + n.g %% cardinality(%(other)s::bigint[])]
        ELSE (%(match)s::bigint[])[1 + n.g %% cardinality(%(match)s::bigint[])]
    END AS selector_id,
    -- The priority pattern: every run normal, or low/normal/high by g %% 3
    -- (coprime with the selector counts, so every (selector, priority) slice fills).
    (%(levels)s::smallint[])[1 + n.g %% cardinality(%(levels)s::smallint[])] AS priority,
    CASE
        WHEN n.g <= %(n_other)s THEN %(base)s + n.g * interval '1 millisecond'
        ELSE %(pool_base)s + (n.g - %(n_other)s) * %(pool_step)s::interval
    END AS at
    FROM numbered n
)
INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector, selector_id,
                 priority, first_pending_at, failure_reason, sealed_chunks, created_at, updated_at)
SELECT gen_random_uuid(), %(org)s, c.stack_id, c.deployment_id, 1, 'pending', rs.selector, rs.id,
       c.priority, c.at, '', 0, c.at, c.at
FROM chosen c JOIN run_selector rs ON rs.id = c.selector_id
ORDER BY c.g  -- heap order follows age, as a real queue's would
"""


def _truncate() -> None:
    execute(
        "TRUNCATE run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, organization "
        "CASCADE"
    )


def _vacuum(*tables: str) -> float:
    t0 = time.perf_counter()
    execute(f"VACUUM (ANALYZE) {', '.join(tables)}")
    return time.perf_counter() - t0


def load_case(size: int, shape: str, matching_selectors: int, priorities: str) -> Case:
    """Load ``size`` pending runs of ``shape`` for a fresh org with one polling group (inside load_all)."""
    from django.utils import timezone

    from gantry import conf
    from gantry.core.models import Organization, RunnerGroup, RunSelector

    # A budget the bench never exhausts: claims go through the throttle (one
    # Redis round trip each, as in production) and are never refused.
    org = Organization.objects.create(
        slug=f"bench-{size}-{shape}", name=f"bench {size} {shape}", runs_per_hour_limit=BENCH_RUNS_PER_HOUR
    )
    group = RunnerGroup.objects.create(
        organization=org, name="bench", labels=GROUP_LABELS, max_concurrent_runs=HUGE_CAPACITY
    )
    match = [RunSelector.objects.create(organization=org, selector=s).id for s in MATCHING[:matching_selectors]]
    other = [RunSelector.objects.create(organization=org, selector=s).id for s in NON_MATCHING]
    pool = size if shape == "all" else max(1, size // 100)
    now = timezone.now()
    base = now - timedelta(days=1)  # the non-matching runs (and, single, all): one millisecond apart from here
    if priorities == "mixed":
        # The pool spread evenly up to now over several aging windows: the claim's order mixes
        # priority and age, and the runs keep aging (crossing levels) while the bench runs.
        span = timedelta(seconds=AGING_WINDOWS_SPANNED * conf.get().priority_aging_seconds)
        pool_base, pool_step = now - span, span / pool
    else:
        # As before priorities: the pool continues the millisecond sequence.
        pool_base, pool_step = base + (size - pool) * timedelta(milliseconds=1), timedelta(milliseconds=1)
    params = {
        "org": org.id,
        "n": size,
        "n_other": size - pool,
        "other": other,
        "match": match,
        "levels": PRIORITY_PATTERNS[priorities],
        "base": base,
        "pool_base": pool_base,
        "pool_step": pool_step,
    }
    t0 = time.perf_counter()
    execute(_LOAD_SQL, params)
    took = time.perf_counter() - t0
    print(f"  loaded {size:>9,} runs ({shape}, {pool:,} matching, {priorities} priority) in {took:6.1f} s", flush=True)
    return Case(size=size, shape=shape, group=group, matching_ids=match, pool=pool)


# run's indexes that back no constraint (the pkey and the UNIQUE constraint stay).
_SECONDARY_INDEXES_SQL = """
SELECT indexname, indexdef FROM pg_indexes
WHERE schemaname = current_schema() AND tablename = 'run'
  AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = 'run'::regclass)
"""


def load_all(sizes: list[int], shapes: list[str], matching_selectors: int, priorities: str) -> list[Case]:
    """Empty the Gantry tables and load every (size, shape) case, in one transaction.

    Bulk-load mode, for this transaction only: no per-row FK checks or NOTIFY
    triggers (rows are consistent by construction), sorts in memory, and run's
    secondary indexes dropped during the inserts and rebuilt once at the end
    (a sorted build is several times faster than a million insertions into
    each of a dozen indexes; the rebuild also re-checks the partial unique
    indexes). DDL is transactional: a failed load leaves the schema as it was.
    """
    from django.db import transaction

    _truncate()
    t0 = time.perf_counter()
    with transaction.atomic():
        execute("SET LOCAL session_replication_role = replica")
        execute("SET LOCAL work_mem = '256MB'")
        execute("SET LOCAL maintenance_work_mem = '512MB'")
        indexes = execute(_SECONDARY_INDEXES_SQL)
        for name, _ in indexes:
            execute(f'DROP INDEX "{name}"')
        cases = [load_case(size, shape, matching_selectors, priorities) for size in sizes for shape in shapes]
        t1 = time.perf_counter()
        for _, definition in indexes:
            execute(definition)
        print(f"  rebuilt run's {len(indexes)} secondary indexes in {time.perf_counter() - t1:.1f} s", flush=True)
    vacuum_s = _vacuum("organization", "runner_group", "run_selector", "stack", "deployment", "run")
    print(f"  vacuum analyze {vacuum_s:.1f} s; total {time.perf_counter() - t0:.1f} s", flush=True)
    return cases


# --------------------------------------------------------------------------- concurrency


def _backend_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a local PostgreSQL backend (nan when the server is not on this host)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Batch:
    wall: float  # seconds from release to the last thread finishing
    calls: list[tuple[float, object]]  # (seconds, result) of every call
    client_cpu: float  # CPU seconds of the calling threads (Python, psycopg, Django)
    server_cpu: float  # CPU seconds of their PostgreSQL backends


class Crew:
    """``n`` threads, each with its own Django connection, calling ``step(i)`` in timed batches.

    A batch lets the threads make at most ``budget`` calls in total and stops
    them at its deadline. Besides wall time and per-call latency it records CPU
    time on both sides of the connection, which stays meaningful on a machine
    shared with other work (wall time there includes waiting for a core).
    """

    def __init__(self, n: int, step: Callable[[int], object]) -> None:
        self._step = step
        self._start = threading.Barrier(n + 1)
        self._done = threading.Barrier(n + 1)
        self._lock = threading.Lock()
        self._budget = 0
        self._deadline = 0.0
        self._stop = False
        self._out: list[list[tuple[float, object]]] = [[] for _ in range(n)]
        self._cpu: list[tuple[float, float]] = [(0.0, 0.0)] * n
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _take(self) -> bool:
        with self._lock:
            if self._budget <= 0 or time.perf_counter() >= self._deadline:
                return False
            self._budget -= 1
            return True

    def _work(self, i: int) -> None:
        from django.db import connection

        try:
            while True:
                self._start.wait()
                if self._stop:
                    return
                try:
                    connection.ensure_connection()
                    pid = connection.connection.info.backend_pid
                    client0, server0 = time.thread_time(), _backend_cpu_seconds(pid)
                    while self._take():
                        t0 = time.perf_counter()
                        result = self._step(i)
                        self._out[i].append((time.perf_counter() - t0, result))
                    self._cpu[i] = (time.thread_time() - client0, _backend_cpu_seconds(pid) - server0)
                except BaseException as exc:  # surfaced by batch(); the barrier must still be reached
                    self._errors.append(exc)
                self._done.wait()
        finally:
            connection.close()  # back to the pool: one connection per thread, for the thread's life

    def batch(self, *, budget: int, seconds: float) -> Batch:
        self._budget = budget
        self._deadline = time.perf_counter() + seconds
        t0 = time.perf_counter()
        self._start.wait()
        self._done.wait()
        wall = time.perf_counter() - t0
        if self._errors:
            raise RuntimeError("a bench thread failed") from self._errors[0]
        calls = [c for out in self._out for c in out]
        for out in self._out:
            out.clear()
        return Batch(wall, calls, sum(c for c, _ in self._cpu), sum(s for _, s in self._cpu))

    def close(self) -> None:
        self._stop = True
        self._start.wait()
        for t in self._threads:
            t.join()


# --------------------------------------------------------------------------- measuring


@dataclass
class Round:
    what: str  # "claim", "floor", or "variant: ..."
    size: int
    shape: str
    pollers: int
    calls: int = 0  # successful calls (claims that won a run; floor updates)
    attempts: int = 0  # every call, empty answers included
    elapsed: float = 0.0  # timed wall seconds (sum of batches)
    latencies: list[float] = field(default_factory=list)
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    empties: int = 0
    false_empties: int = 0
    refills: int = 0  # times the claimed runs were set back to pending
    floor: Round | None = None  # the floor measured in slices alternating with this round

    def add(self, batch: Batch, won: int) -> None:
        self.elapsed += batch.wall
        self.calls += won
        self.attempts += len(batch.calls)
        self.latencies.extend(dt for dt, _ in batch.calls)
        self.client_cpu += batch.client_cpu
        self.server_cpu += batch.server_cpu

    @property
    def rate(self) -> float:
        return self.calls / self.elapsed if self.elapsed else 0.0

    def pct_ms(self, q: float) -> float:
        """Nearest-rank percentile of the latencies, in milliseconds."""
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000

    def cpu_ms(self, side: str) -> float:
        """CPU milliseconds per call on the "client" or "server" side."""
        total = self.client_cpu if side == "client" else self.server_cpu
        return total / self.attempts * 1000 if self.attempts else math.nan


ClaimFn = Callable[["RunnerGroup"], "uuid.UUID | None"]


def real_claim(group: RunnerGroup) -> uuid.UUID | None:
    """The code path under test: ``gantry.dispatch.claim.claim``."""
    from gantry.dispatch.claim import claim

    result = claim(group=group)
    return result.run_id if result is not None else None


def _refill(case: Case, run_ids: list[uuid.UUID]) -> None:
    """Outside the timed region: drop the group's stub runners, put claimed runs back to pending."""
    from django.db import transaction

    with transaction.atomic():
        # The FK is ON DELETE SET NULL: this also clears run.assigned_runner_id.
        execute("DELETE FROM runner WHERE runner_group_id = %s", [case.group.id])
        if run_ids:
            execute(
                "UPDATE run SET status = 'pending', assigned_runner_id = NULL, assigned_at = NULL, "
                "assigned_expires_at = NULL WHERE id = ANY(%s::uuid[])",
                [run_ids],
            )


def _claimable_matching(case: Case) -> int:
    return int(
        execute(
            "SELECT count(*) FROM run WHERE organization_id = %s AND selector_id = ANY(%s::bigint[]) "
            "AND status = 'pending' AND assigned_runner_id IS NULL",
            [case.group.organization_id, case.matching_ids],
        )[0][0]
    )


def _ensure_floor_table() -> None:
    execute("CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    execute("INSERT INTO bench_floor (id) SELECT g FROM generate_series(1, %s) g ON CONFLICT DO NOTHING", [FLOOR_ROWS])


def _floor_step(i: int) -> None:
    """The floor: a bare single-row UPDATE, autocommit (one statement, one commit), thread i on row i + 1."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("UPDATE bench_floor SET n = n + 1 WHERE id = %s", [(i % FLOOR_ROWS) + 1])


@dataclass
class _Pool:
    """A case's matching pool, shared by every claim function measured on the case."""

    case: Case
    left: int  # matching runs still pending: claims allowed before the next refill
    claimed: list[uuid.UUID] = field(default_factory=list)

    def refill(self) -> None:
        _refill(self.case, self.claimed)
        self.claimed.clear()
        self.left = self.case.pool


def measure(cases: list[Case], claimers: list[tuple[str, ClaimFn]], pollers: int, seconds: float) -> list[Round]:
    """``seconds`` of timed claims for every (claim function, case) by ``pollers`` threads polling the case's group.

    Time is cut into slices that rotate over every case and, within a case,
    over every claim function; each claim slice (``SLICE`` s) is preceded by a
    floor slice (``FLOOR_SLICE`` s, same number of threads). So every row and
    its floor see the same mix of background load: sizes compare with each
    other, variants with the real claim, and claims with the floor, even on a
    machine that is busy with other work. The run table is vacuumed (outside
    the timed region) before each rotation, as an autovacuum pass would.
    """
    current: list[tuple[ClaimFn, Case]] = [(claimers[0][1], cases[0])]  # what the claim crew runs now
    crew = Crew(pollers, lambda _i: current[0][0](current[0][1].group))
    floor_crew = Crew(pollers, _floor_step)
    pools = [_Pool(c, left=c.pool) for c in cases]
    rounds = {(what, i): Round(what, c.size, c.shape, pollers) for what, _ in claimers for i, c in enumerate(cases)}
    try:
        # Warm-up (connections, caches, prepared plans past their first custom plans), not counted.
        floor_crew.batch(budget=100 * pollers, seconds=1.0)
        for pool in pools:
            for _, fn in claimers:
                current[0] = (fn, pool.case)
                warm = crew.batch(budget=min(pool.case.pool, 10 * pollers), seconds=2.0)
                pool.claimed.extend(r for _, r in warm.calls if isinstance(r, uuid.UUID))
                pool.refill()
        rotation = 0
        while any(r.elapsed < seconds for r in rounds.values()):
            rotation += 1
            _vacuum("run", "runner", "runner_group", "run_event", "bench_floor")
            for i, pool in enumerate(pools):
                for what, fn in claimers:
                    if rounds[(what, i)].elapsed < seconds:
                        current[0] = (fn, pool.case)
                        _claim_slice(pool, rounds[(what, i)], crew, floor_crew, seconds)
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"  {pollers} poller(s): rotation {rotation} done, load average {load}", flush=True)
    finally:
        crew.close()
        floor_crew.close()
        for pool in pools:
            pool.refill()
    return list(rounds.values())


def _claim_slice(pool: _Pool, r: Round, crew: Crew, floor_crew: Crew, seconds: float) -> None:
    """One floor slice, then claim batches on ``pool``'s case until ``r`` has had ``SLICE`` more timed seconds."""
    if r.floor is None:
        r.floor = Round("floor", r.size, r.shape, r.pollers)
    batch = floor_crew.batch(budget=sys.maxsize, seconds=FLOOR_SLICE)
    r.floor.add(batch, won=len(batch.calls))
    slice_end = min(seconds, r.elapsed + SLICE)
    while r.elapsed < slice_end:
        if pool.left == 0:
            pool.refill()
            r.refills += 1
        # Never more attempts than matching runs: every None is an empty answer while work existed.
        batch = crew.batch(budget=pool.left, seconds=slice_end - r.elapsed)
        won = [x for _, x in batch.calls if isinstance(x, uuid.UUID)]
        r.add(batch, won=len(won))
        pool.claimed.extend(won)
        pool.left -= len(won)
        empty = len(batch.calls) - len(won)
        if empty:
            r.empties += empty
            if _claimable_matching(pool.case) > 0:  # confirmed: matching work is still pending
                r.false_empties += empty


# --------------------------------------------------------------------------- variants
#
# Not the code under test: claim()'s prepared statement run through a
# different transaction shape each, so their rows compare with the real one.
# They size the transaction choices docs/performance.md discusses.


@dataclass(frozen=True)
class Variant:
    name: str
    # "durable commit": claim()'s messages, but COMMIT waits for the WAL flush
    # (claim.py before decision 13). "begin apart": Django's atomic block,
    # BEGIN its own round trip, durable commit (claim.py before P4). "token
    # after commit": the statement commits on its own and the throttle token
    # is taken after it (P3, not the contract: a throttled claim would have
    # to hand its run back).
    transaction: str

    def claim(self) -> ClaimFn:
        """A copy of claim()'s won-claim path (statement, throttle call, outcome and wait metrics, runner token)."""
        import psycopg
        from django.db import connection, transaction
        from django.utils import timezone

        from gantry import conf, metrics
        from gantry.core import tokens
        from gantry.core.models import Priority
        from gantry.dispatch import throttle
        from gantry.dispatch.claim import _consume_dispatch_token
        from gantry.sql.claim import CLAIM
        from gantry.sql.statement import execute_text

        def run(group: RunnerGroup) -> uuid.UUID | None:
            now = timezone.now()
            runner_id = uuid.uuid4()
            expires = now + timedelta(seconds=conf.get().assignment_ttl)
            args = {"now": now, "grp": group.id, "org": group.organization_id, "runner": runner_id,
                    "expires": expires, "version": None, "rate": None,
                    "aging": conf.get().priority_aging_seconds}  # fmt: skip
            connection.ensure_connection()
            conn = connection.connection
            CLAIM.ensure_prepared(conn)
            execute = execute_text(CLAIM, args, conn)
            if self.transaction == "token after commit":
                with psycopg.ClientCursor(conn) as cur:
                    row = cur.execute(execute).fetchone()
                if row is None:
                    return None
                outcome = _consume_dispatch_token(
                    organization_id=group.organization_id, now=now, runs_per_hour_limit=row[1]
                )
            elif self.transaction == "durable commit":
                with psycopg.ClientCursor(conn) as cur:
                    cur.execute("BEGIN; " + execute)
                    cur.nextset()
                    row = cur.fetchone()
                    if row is None:
                        conn.commit()
                        return None
                    try:
                        outcome = _consume_dispatch_token(
                            organization_id=group.organization_id, now=now, runs_per_hour_limit=row[1]
                        )
                    except BaseException:
                        conn.rollback()
                        raise
                conn.commit()
            else:
                with transaction.atomic(), psycopg.ClientCursor(conn) as cur:
                    row = cur.execute(execute).fetchone()
                    if row is None:
                        return None
                    outcome = _consume_dispatch_token(
                        organization_id=group.organization_id, now=now, runs_per_hour_limit=row[1]
                    )
            throttle.record(outcome)
            metrics.record_claim(organization_id=group.organization_id, group_id=group.id,
                                 priority=Priority(row[3]).label, waited=(now - row[2]).total_seconds(),
                                 at=now.timestamp())  # fmt: skip
            tokens.mint_runner_token(runner_id=runner_id, run_id=row[0], group_id=group.id)
            return uuid.UUID(str(row[0]))

        return run


def variants() -> list[Variant]:
    return [
        Variant("variant: durable commit", "durable commit"),
        Variant("variant: begin apart", "begin apart"),
        Variant("variant: token after commit", "token after commit"),
    ]


# --------------------------------------------------------------------------- EXPLAIN


def explain_claim(case: Case) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim as claim() runs it, in a transaction that is rolled back.

    The statement is executed six times before the one shown, as on a warm
    pooled connection, so the plan shown is the one the plan cache settled on
    (generic when its cost is no worse than the custom plans').
    """
    import psycopg
    from django.db import connection, transaction
    from django.utils import timezone

    from gantry import conf
    from gantry.sql.claim import CLAIM
    from gantry.sql.statement import execute_text

    lines: list[str] = []
    connection.ensure_connection()
    CLAIM.ensure_prepared(connection.connection)
    for _ in range(7):  # the last one is shown
        now = timezone.now()
        args = {"now": now, "grp": case.group.id, "org": case.group.organization_id, "runner": uuid.uuid4(),
                "expires": now + timedelta(minutes=5), "version": None, "rate": None,
                "aging": conf.get().priority_aging_seconds}  # fmt: skip
        execute = execute_text(CLAIM, args, connection.connection)
        with transaction.atomic(), psycopg.ClientCursor(connection.connection) as cur:
            lines = [row[0] for row in cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + execute).fetchall()]
            transaction.set_rollback(True)
    return lines


# --------------------------------------------------------------------------- report


def _print_table(rounds: list[Round]) -> None:
    head = (
        f"{'size':>9} {'shape':<11} {'poll':>4}  {'what':<30} {'claims/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'false∅':>6} {'refill':>6} {'cpu cli':>7} {'cpu srv':>7} {'floor/s':>8} {'fl p50':>6} "
        f"{'fl cpu':>6} {'÷floor':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rounds:
        f = r.floor
        floor_cols = (
            f"{f.rate:>8,.0f} {f.pct_ms(0.5):>6.3f} {f.cpu_ms('client') + f.cpu_ms('server'):>6.3f} "
            f"{r.rate / f.rate:>6.2f}"
            if f and f.rate
            else ""
        )
        print(
            f"{r.size:>9,} {r.shape:<11} {r.pollers:>4}  {r.what[:30]:<30} {r.rate:>8,.0f} {r.pct_ms(0.5):>7.3f} "
            f"{r.pct_ms(0.99):>7.3f} {r.false_empties:>6} {r.refills:>6} {r.cpu_ms('client'):>7.3f} "
            f"{r.cpu_ms('server'):>7.3f} {floor_cols}"
        )
    print(
        "  cpu cli / cpu srv: CPU ms per call in the polling threads / their PostgreSQL backends; fl cpu: both, "
        "for the floor;\n  ÷floor: claims/s ÷ floor updates/s, measured in alternating slices with the same "
        "thread count; refill: times the claimed runs were set back to pending"
    )


def _total_cpu(r: Round) -> float:
    return r.cpu_ms("client") + r.cpu_ms("server")


def _print_targets(rounds: list[Round]) -> None:
    """The three targets, for the real claim and (labelled "what if") for each variant."""

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    for what in dict.fromkeys(r.what for r in rounds):
        mine = [r for r in rounds if r.what == what]
        single = [r for r in mine if r.pollers == 1]
        print(f"\ntargets: {what}" + ("" if what == "claim" else " (what if claim.py did this)"))
        adv = sorted((r for r in single if r.shape == "adversarial"), key=lambda r: r.size)
        if len(adv) >= 2:
            small, big = adv[0], adv[-1]
            growth = big.pct_ms(0.5) / small.pct_ms(0.5)
            print(
                f"  (i)   p50 {big.size:,} adversarial ÷ p50 {small.size:,} adversarial, 1 poller: "
                f"{big.pct_ms(0.5):.3f} / {small.pct_ms(0.5):.3f} ms = {growth:.2f} (≤ {TARGET_LATENCY_GROWTH}) "
                f"{verdict(growth <= TARGET_LATENCY_GROWTH)}"
            )
            print(
                f"        (load-independent view: server CPU per claim {big.cpu_ms('server'):.3f} vs "
                f"{small.cpu_ms('server'):.3f} ms = {big.cpu_ms('server') / small.cpu_ms('server'):.2f})"
            )
        else:
            print("  (i)   needs the adversarial shape at two sizes or more, 1 poller")
        ratios = [(r.rate / r.floor.rate, r) for r in single if r.floor and r.floor.rate]
        if ratios:
            worst, at = min(ratios, key=lambda x: x[0])
            listing = ", ".join(f"{r.size:,} {r.shape} {x:.2f}" for x, r in ratios)
            print(
                f"  (ii)  1-poller claims/s ÷ floor ≥ {TARGET_FLOOR_RATIO}: worst {worst:.2f} ({at.size:,} {at.shape}) "
                f"{verdict(worst >= TARGET_FLOOR_RATIO)}\n        [{listing}]"
            )
            cpu = [(_total_cpu(r.floor) / _total_cpu(r), r) for _, r in ratios if r.floor]
            print(
                "        (load-independent view, floor CPU per update ÷ claim CPU per claim, client + server: "
                + ", ".join(f"{r.size:,} {r.shape} {x:.2f}" for x, r in cpu)
                + ")"
            )
        false_1 = sum(r.false_empties for r in single)
        many = sorted({r.pollers for r in mine if r.pollers > 1})
        extra = "".join(f"; at {p} pollers: {sum(r.false_empties for r in mine if r.pollers == p)}" for p in many)
        print(f"  (iii) false empties at 1 poller while matching work exists: {false_1}{extra} {verdict(false_1 == 0)}")


# --------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.poll_claim",
        description=__doc__.split("\n")[0],
        epilog=SERVICES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=_ints, default=[1_000, 100_000, 1_000_000], help="backlog sizes")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed claim seconds per round")
    parser.add_argument("--pollers", type=_ints, default=[1, 8], help="concurrent pollers per round")
    parser.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES), help="all,adversarial")
    parser.add_argument("--matching-selectors", type=int, default=4, choices=range(1, len(MATCHING) + 1))
    parser.add_argument("--no-variants", action="store_true", help="measure only the real claim()")
    parser.add_argument(
        "--priorities",
        choices=list(PRIORITY_PATTERNS),
        default="single",
        help="single: every run normal; mixed: low/normal/high by age rank, the pool's ages spread over "
        f"{AGING_WINDOWS_SPANNED} aging windows",
    )
    args = parser.parse_args(argv)
    unknown = set(args.shapes) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shape(s): {', '.join(sorted(unknown))}")

    url = database_url(DEFAULT_DATABASE_URL)
    # Pollers and floor threads run side by side, each on its own pooled connection.
    os.environ.setdefault("GANTRY_DB_POOL_MAX", str(max(20, 2 * max(args.pollers) + 4)))
    # The throttle's buckets go to a Redis database of the bench's own: the bench's org ids
    # stay away from those of anything else sharing the server.
    bootstrap(url)
    _ensure_floor_table()
    parts = urlsplit(url)
    print(f"database {parts.hostname}:{parts.port or 5432}/{unquote(parts.path.lstrip('/'))}")
    for note in _server_notes():
        print(note)
    from gantry import conf

    limiter = "on" if conf.get().rate_limit_enabled else "off"
    print(f"throttle: rate limit {limiter}, REDIS_URL {os.environ['REDIS_URL']}")
    print(
        f"sizes {args.sizes}, shapes {args.shapes}, pollers {args.pollers}, {args.seconds:g} s per round, "
        f"{args.matching_selectors} matching selectors, {args.priorities} priorities "
        f"(aging {conf.get().priority_aging_seconds} s)\n",
        flush=True,
    )

    measured: list[Variant | None] = [None]  # None: the real claim()
    measured += [] if args.no_variants else variants()
    rounds: list[Round] = []
    explains: dict[str, list[str]] = {}
    print("loading (one org per size and shape)", flush=True)
    cases = load_all(args.sizes, args.shapes, args.matching_selectors, args.priorities)
    biggest = next((c for c in reversed(cases) if c.shape == "adversarial" and c.size == max(args.sizes)), None)
    if biggest is not None:
        explains["claim, as claim.py runs it"] = explain_claim(biggest)
    claimers: list[tuple[str, ClaimFn]] = [
        ("claim", real_claim) if v is None else (v.name, v.claim()) for v in measured
    ]
    for pollers in args.pollers:
        print(f"measuring, {pollers} poller(s)", flush=True)
        for r in measure(cases, claimers, pollers, args.seconds):
            rounds.append(r)
            floor_rate = r.floor.rate if r.floor else math.nan
            print(
                f"  {r.size:>9,} {r.shape:<11} {r.what:<30} {r.rate:7,.0f}/s p50 {r.pct_ms(0.5):6.3f} ms "
                f"p99 {r.pct_ms(0.99):6.3f} ms, false empties {r.false_empties}; "
                f"floor {floor_rate:,.0f}/s, ratio {r.rate / floor_rate:.2f}",
                flush=True,
            )
    order = {w: i for i, w in enumerate(dict.fromkeys(r.what for r in rounds))}
    rounds.sort(key=lambda r: (r.size, args.shapes.index(r.shape), order[r.what], r.pollers))

    print()
    _print_table(rounds)
    _print_targets(rounds)
    for title, lines in explains.items():
        print(f"\nEXPLAIN (ANALYZE, BUFFERS) at {max(args.sizes):,} adversarial, {title}, rolled back:")
        print("\n".join("  " + line for line in lines))
        plan = "\n".join(lines)
        used = sorted(set(re.findall(r"using (\w+) on run\b", plan)))
        used += ["a sequential scan"] if re.search(r"Seq Scan on run\b", plan) else []
        print(f"  how the plan reads run: {', '.join(used) or 'not at all'}")
    print(f"\nload average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
