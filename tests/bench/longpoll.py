"""Long-poll benchmark: P parked polls against the production server mode, one new run at a time.

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.longpoll [--levels 1,50,200,1000] [--runs 20] [--repeat 3] [--workers 2]
                                   [--threads 16] [--poll-threads 3] [--calls 100]

The bench and its server use exactly the database ``DATABASE_URL`` names
(default ``postgres://postgres@127.0.0.1:5432/gantry_bench_longpoll``; created
when missing and migrated; each invocation adds a fresh org and leaves it
there; one holding a superuser is refused), and a Redis database of the
bench's own on ``REDIS_URL``'s server (tests/bench/common.py). A run of the defaults
takes about four minutes. It is a measurement, not a test: it exits 0 either
way. Figures and their reading: docs/performance.md, "Parked long polls".

What it does:

1. Starts the server as production runs it (README): ``gunicorn gantry.asgi
   --worker-class uvicorn_worker.UvicornWorker`` with ``--workers``, the
   repository's gunicorn.conf.py, against the bench database. The server's
   database sessions carry ``application_name = gantry-bench-server``
   (libpq's PGAPPNAME), so pg_stat_activity tells them from the bench's own.
2. Makes one org with a polling group (room for every run, a runs/hour budget
   it never spends), one stack per run to be created, and a member with an
   API token.
3. Each repetition: the unrelated call (``GET /api/v1/orgs/{org}/queue``
   with the member's token, ``--calls`` times in a row) with no poll parked
   (at the start and again at the end of the repetition; the ratio's baseline
   is their mean);
   then for each level P, tops the parked polls up to P (asyncio + httpx in
   this process; every poll is ``?wait=30`` and polls again as soon as it is
   answered, as a coordinator does), waits until the server has made P first
   attempts, and measures, with the P polls parked: the unrelated call's
   latencies; the server's CPU over 3 idle seconds; its database sessions
   (total, and not idle); then creates ``--runs`` runs one at a time (each
   committed by the bench through ``services.deployment_create``), timing
   commit to the 200 that carries that run's id, while sampling the
   server's sessions every 20 ms. Claim attempts come from the server's
   ``/metrics`` (``gantry_poll_fleet_claim_attempts``, summed over workers):
   ``wake`` attempts per new run is the issue's figure; ``first`` attempts
   (column ``polls/s``: per second) are new poll requests: answered polls
   polling again and polls past their deadline, each one claim, as under any
   server. A poller's first wait is spread over 1-30 s, so deadlines arrive
   at a fleet's steady rate (P/30 per second), not all at once. Columns: ``open``/``peak``
   are all the server's open sessions (its pools' and listeners', sync routes
   included) while parked / peak during the new runs; ``poll`` is what the
   poll path holds: the listener sessions plus the peak of busy sessions
   during the new runs (parked polls hold none).
4. Prints one table per repetition and the median of the repetitions, with
   the issue's four targets at the largest level.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute

ROOT = Path(__file__).resolve().parents[2]
APP_NAME = "gantry-bench-server"
POLL = "/api/v1/runner-groups/poll?wait=30"
TICK = os.sysconf("SC_CLK_TCK")
PER_CLIENT = 50  # pollers per httpx client


@dataclass
class Setup:
    org_slug: str
    group_token: str
    api_token: str
    stacks: list[Any]
    database: str


@dataclass
class Level:
    parked: int
    unrelated_p50_ms: float
    unrelated_p99_ms: float
    idle_cpu_pct: float = 0.0
    sessions: int = 0
    sessions_busy_peak: int = 0
    sessions_peak: int = 0
    listeners: int = 0
    answer_ms: list[float] = field(default_factory=list)
    wake_attempts: float = 0.0
    first_attempts: float = 0.0
    missed: int = 0


def setup(runs: int) -> Setup:
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from gantry.core import services, tokens
    from gantry.core.models import SELECTOR_PREFIX, Membership, Role

    tag = uuid.uuid4().hex[:8]
    org = services.org_create(slug=f"lp-{tag}", name=f"Long poll {tag}")
    services.org_set_runs_per_hour_limit(org=org, limit=10_000_000)
    group, _ = services.runner_group_create(
        org=org, name="fleet", labels={"os": "linux"}, max_concurrent_runs=1_000_000
    )
    spec = {"steps": [{"name": "a", "run": "true"}]}
    stacks = [
        services.stack_create(org=org, name=f"s{i}", labels={SELECTOR_PREFIX + "os": "linux"}, spec=spec)
        for i in range(runs)
    ]
    user = User.objects.create_user(username=f"lp-{tag}")
    Membership.objects.create(user=user, organization=org, role=Role.MEMBER)
    from django.db import connection

    return Setup(
        org_slug=org.slug,
        group_token=tokens.mint_group_token(
            group_id=group.id, token_version=group.token_version, organization_id=group.organization_id
        ),
        api_token=Token.objects.create(user=user).key,
        stacks=stacks,
        database=connection.settings_dict["NAME"],
    )


# ---------------------------------------------------------------- the server


def start_server(port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PGAPPNAME": APP_NAME,
        "GANTRY_LOG_LEVEL": "WARNING",
        "GANTRY_SYNC_THREADS": str(args.threads),
        "GANTRY_POLL_THREADS": str(args.poll_threads),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "gantry.asgi", "-b", f"127.0.0.1:{port}",
                "--worker-class", "uvicorn_worker.UvicornWorker", "--workers", str(args.workers),
                "--no-control-socket", "--backlog", "4096",
            ],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return proc
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("the server never answered /healthz") from None
            time.sleep(0.2)


def server_cpu_seconds(master: int) -> float:
    """utime + stime of the master and its workers."""
    pids = [master]
    with contextlib.suppress(OSError):
        pids += [int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()]
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def sessions() -> tuple[int, int, int]:
    """The server's database sessions: (all open, busy, listeners).

    Busy: not idle (a statement or a transaction in progress). Listeners: the
    one LISTEN session per process (idle between notifications; its last
    statement is the LISTEN or the leader lock's try).
    """
    rows = execute(
        "SELECT count(*), count(*) FILTER (WHERE state <> 'idle'), "
        "count(*) FILTER (WHERE query ILIKE 'LISTEN %%' OR query ILIKE '%%pg_try_advisory_lock%%') "
        "FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
        [APP_NAME],
    )
    return int(rows[0][0]), int(rows[0][1]), int(rows[0][2])


async def get_retrying(client: Any, path: str, **kw: Any) -> Any:
    """A GET that survives the keep-alive race (the server closed an idle connection as we reused it)."""
    import httpx

    for attempt in range(3):
        try:
            return await client.get(path, **kw)
        except (httpx.RemoteProtocolError, httpx.ConnectError):
            if attempt == 2:
                raise
            await asyncio.sleep(0.1)


async def fleet_attempts(client: Any) -> dict[str, float]:
    text = (await get_retrying(client, "/metrics")).text
    return {
        kind: float(m.group(1)) if (m := re.search(rf'^gantry_poll_fleet_claim_attempts_total{{kind="{kind}"}} (\S+)$',
                                                    text, re.MULTILINE)) else 0.0
        for kind in ("first", "wake")
    }  # fmt: skip


async def settled_attempts(client: Any) -> dict[str, float]:
    """The fleet figure once every worker has flushed (each flushes about once a second)."""
    await asyncio.sleep(1.5)
    return await fleet_attempts(client)


# ---------------------------------------------------------------- the clients


class Fleet:
    """P coordinators' polls: each polls again as soon as it is answered."""

    def __init__(self, clients: Any, token: str) -> None:
        # httpx's pool does work proportional to its connections on every request
        # (O(n^2) with n in flight): one client of 1,000 connections stalls the
        # bench itself for seconds. One client per 50 pollers keeps it flat.
        self.clients = clients
        self.token = token
        self.tasks: list[asyncio.Task[None]] = []
        self.answered: dict[str, float] = {}  # run id -> perf_counter() at the answer
        self.errors = 0

    async def _poller(self, client: Any) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        # A fleet's coordinators did not all start in the same second: the first
        # wait is spread over 1-30 s, so deadlines (each one a new poll, one
        # claim) come at the steady rate of P/30 per second, not in a storm.
        path = f"/api/v1/runner-groups/poll?wait={random.randint(1, 30)}"
        while True:
            try:
                resp = await client.get(path, headers=headers)
                path = POLL
            except asyncio.CancelledError:
                raise
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.5)
                continue
            if resp.status_code == 200:
                self.answered[resp.json()["run_id"]] = time.perf_counter()
            elif resp.status_code != 204:
                self.errors += 1
                await asyncio.sleep(0.5)

    def grow(self, n: int) -> None:
        while len(self.tasks) < n:
            client = self.clients[len(self.tasks) // PER_CLIENT]
            self.tasks.append(asyncio.create_task(self._poller(client)))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


async def unrelated(client: Any, s: Setup, calls: int) -> tuple[float, float]:
    headers = {"Authorization": f"Token {s.api_token}"}
    path = f"/api/v1/orgs/{s.org_slug}/queue"
    for _ in range(5):  # warm (and past the keep-alive race of an idle connection)
        (await get_retrying(client, path, headers=headers)).raise_for_status()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        (await client.get(path, headers=headers)).raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def create_run(stack: Any) -> tuple[str, float]:
    from gantry.core import services
    from gantry.core.models import Run

    deployment = services.deployment_create(stack=stack)  # committed on return (autocommit)
    committed = time.perf_counter()
    return str(Run.objects.values_list("id", flat=True).get(deployment=deployment)), committed


async def measure_level(
    parked: int, client: Any, fleet: Fleet, s: Setup, stacks: list[Any], args: argparse.Namespace, master: int
) -> Level:
    before = await settled_attempts(client)
    new = parked - len(fleet.tasks)
    fleet.grow(parked)
    deadline = time.monotonic() + 120
    while (await fleet_attempts(client))["first"] < before["first"] + new:
        if time.monotonic() > deadline:
            raise SystemExit(f"{parked} polls never parked (errors: {fleet.errors})")
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # the last first attempts finish and park
    p50, p99 = await unrelated(client, s, args.calls)
    level = Level(parked, p50, p99)
    cpu0, t0 = server_cpu_seconds(master), time.perf_counter()
    await asyncio.sleep(3)
    level.idle_cpu_pct = 100 * (server_cpu_seconds(master) - cpu0) / (time.perf_counter() - t0)
    level.sessions, _, level.listeners = await asyncio.to_thread(sessions)

    stop_sampling = threading.Event()
    peaks = [0, 0]

    def sample() -> None:
        while not stop_sampling.is_set():
            total, busy, _ = sessions()
            peaks[0], peaks[1] = max(peaks[0], total), max(peaks[1], busy)
            stop_sampling.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = await settled_attempts(client)
    started = time.perf_counter()
    for stack in stacks:
        run_id, committed = await asyncio.to_thread(create_run, stack)
        give_up = time.perf_counter() + 10
        while run_id not in fleet.answered and time.perf_counter() < give_up:
            await asyncio.sleep(0.0005)
        if run_id in fleet.answered:
            level.answer_ms.append((fleet.answered[run_id] - committed) * 1000)
        else:
            level.missed += 1
        await asyncio.sleep(0.1)
    elapsed = time.perf_counter() - started
    end = await settled_attempts(client)
    stop_sampling.set()
    sampler.join()
    level.sessions_peak, level.sessions_busy_peak = peaks
    level.wake_attempts = (end["wake"] - start["wake"]) / len(stacks)
    level.first_attempts = (end["first"] - start["first"]) / (elapsed + 1.5)  # per second (1.5: the settle)
    return level


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def table(levels: list[Level], base_p50: float) -> list[tuple[Any, ...]]:
    return [
        (
            lv.parked, pct(lv.answer_ms, 0.5), pct(lv.answer_ms, 0.99), lv.unrelated_p50_ms,
            lv.unrelated_p50_ms / base_p50, lv.wake_attempts, lv.first_attempts, lv.sessions, lv.sessions_peak,
            lv.listeners + lv.sessions_busy_peak, lv.idle_cpu_pct, lv.missed,
        )
        for lv in levels
    ]  # fmt: skip


HEAD = (
    f"{'parked':>6} {'answer p50':>10} {'p99':>7} {'unrel p50':>9} {'ratio':>5} {'wake/run':>8} "
    f"{'polls/s':>9} {'open':>4} {'peak':>4} {'poll':>4} {'idle cpu%':>9} {'missed':>6}"
)


def print_rows(rows: list[tuple[Any, ...]]) -> None:
    print(HEAD)
    for r in rows:
        print(
            f"{r[0]:>6} {r[1]:>8.1f}ms {r[2]:>5.1f}ms {r[3]:>7.2f}ms {r[4]:>5.2f} {r[5]:>8.2f} {r[6]:>9.2f} "
            f"{r[7]:>4} {r[8]:>4} {r[9]:>4} {r[10]:>9.1f} {r[11]:>6}"
        )


async def bench(args: argparse.Namespace, s: Setup, master: int, port: int) -> list[list[tuple[Any, ...]]]:
    import httpx

    limits = httpx.Limits(max_connections=PER_CLIENT, max_keepalive_connections=PER_CLIENT)
    timeout = httpx.Timeout(60.0)
    results = []
    stacks = iter(s.stacks)
    base = f"http://127.0.0.1:{port}"
    polls = [
        httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout)
        for _ in range(-(-max(args.levels) // PER_CLIENT))
    ]
    async with httpx.AsyncClient(base_url=base, timeout=timeout) as client:
        for rep in range(1, args.repeat + 1):
            base_p50, base_p99 = await unrelated(client, s, args.calls)
            print(f"repetition {rep}: unrelated call with none parked p50 {base_p50:.2f} ms, p99 {base_p99:.2f} ms")
            fleet = Fleet(polls, s.group_token)
            levels = []
            for parked in args.levels:
                level = await measure_level(
                    parked, client, fleet, s, [next(stacks) for _ in range(args.runs)], args, master
                )
                levels.append(level)
                print(f"  {parked} parked: done (poll errors so far {fleet.errors})", flush=True)
            await fleet.stop()
            await asyncio.sleep(2)
            after_p50, _ = await unrelated(client, s, args.calls)
            # The baseline is both ends of the repetition: drift in the machine's other load averages out.
            print(f"  unrelated call with none parked again: p50 {after_p50:.2f} ms")
            base_p50 = (base_p50 + after_p50) / 2
            rows = table(levels, base_p50)
            print_rows(rows)
            results.append(rows)
            await asyncio.sleep(2)
    for c in polls:
        await c.aclose()
    return results


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.longpoll",
        description=__doc__.split("\n")[0],
        epilog=SERVICES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--levels", type=_ints, default=[1, 50, 200, 1000], help="parked polls, ascending")
    parser.add_argument("--runs", type=int, default=20, help="new runs per level, one at a time")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians are printed)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=16, help="GANTRY_SYNC_THREADS")
    parser.add_argument("--poll-threads", type=int, default=3, help="GANTRY_POLL_THREADS")
    parser.add_argument("--calls", type=int, default=100, help="unrelated calls per measurement")
    args = parser.parse_args(argv)

    bootstrap(database_url("postgres://postgres@127.0.0.1:5432/gantry_bench_longpoll"))
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    s = setup(args.runs * len(args.levels) * args.repeat)
    from tests.ports import free_port

    port = free_port()
    log = Path(f"/tmp/gantry-bench-longpoll-{port}.log")
    proc = start_server(port, args, log)
    # A SIGTERM to the bench still stops its server (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    print(
        f"server: gunicorn gantry.asgi, UvicornWorker x{args.workers}, GANTRY_SYNC_THREADS={args.threads}, "
        f"GANTRY_POLL_THREADS={args.poll_threads}; database {s.database}; load average {os.getloadavg()[0]:.1f}"
    )
    try:
        results = asyncio.run(bench(args, s, proc.pid, port))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    medians = [
        tuple(statistics.median(rep[i][col] for rep in results) for col in range(len(results[0][0])))
        for i in range(len(args.levels))
    ]
    print(f"\nmedian of {len(results)} repetitions (load average now {os.getloadavg()[0]:.1f}):")
    print_rows([(int(m[0]), *m[1:7], int(m[7]), int(m[8]), int(m[9]), m[10], int(m[11])) for m in medians])
    top = medians[-1]
    print(f"\ntargets at {int(top[0])} parked:")
    print(f"  unrelated call p50 {top[4]:.2f}x of none parked (<= 1.5)  {'PASS' if top[4] <= 1.5 else 'FAIL'}")
    print(
        f"  database sessions held by the poll path (listeners + busy peak) {int(top[9])} (<= 10)  "
        f"{'PASS' if top[9] <= 10 else 'FAIL'}; all the server's open sessions, peak {int(top[8])}"
    )
    print(f"  commit-to-answer p50 {top[1]:.1f} ms (< 20)  {'PASS' if top[1] < 20 else 'FAIL'}")
    print(f"  wake claim attempts per new run {top[5]:.2f} (<= 2)  {'PASS' if top[5] <= 2 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
