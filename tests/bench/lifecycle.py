"""Lifecycle benchmark: K simulated runners against the production server, and /healthz beside them.

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.lifecycle [--ks 1,4,16] [--seconds 8] [--repeat 3] [--runs 4000]
                                    [--mode asgi|gthread | --server-cmd "gunicorn ... -b 127.0.0.1:{port}"]

The bench and the server it starts use exactly the database ``DATABASE_URL``
names (default ``postgres://postgres@127.0.0.1:5432/gantry_bench_lifecycle``);
it is created when missing and migrated, and its Gantry tables are TRUNCATEd:
name a scratch database (one holding a superuser is refused). Redis: a
database of the bench's own on ``REDIS_URL``'s server, four above its
database unless ``GANTRY_REDIS_DB`` says (tests/bench/common.py). It is a
measurement, not a test: it exits 0 either way. Results and their reading are in docs/performance.md ("Runner
routes and the lifecycle benchmark").

What it does, for each repetition and each K:

0. Warms the server up once (unmeasured): a lifecycle phase of
   :data:`WARM_UP_SECONDS` at the highest K, so the connection pools and
   their backends' prepared statements exist before anything is counted.
1. Loads ``--runs`` pending runs (one stack and deployment each, set-based
   SQL) for one org whose one self-hosted group never fills, and a budget the
   bench never exhausts (every claim still makes its throttle call).
2. Starts nothing new: one server, started once as a subprocess from
   :data:`SERVER_MODES` (or ``--server-cmd``), serves every phase. The server
   command lives in that one table.
3. *lifecycle*: K threads, each one keep-alive HTTP connection, loop poll
   (``wait=0``) → ready → accept → status → done → deregister for
   ``--seconds``. Reported: runs/s, lifecycle calls/s, p50/p99 per call, and
   server CPU per run split into Python (the server's processes, from
   /proc/<pid>/stat) and PostgreSQL (the backends connected to the bench's
   database, found by their process title, from /proc as well).
4. *healthz*: the same K threads call ``GET /healthz`` for ``--seconds``:
   requests/s and server CPU per request.
5. *status*: 64 x K runners that hold an accepted run (set up with SQL), K
   threads each calling ``/status`` for its share in turn for ``--seconds``:
   the steady-state load of a fleet, as server CPU per request, compared with
   /healthz. Many runners, not K: a runner calls every few seconds, and K
   runners hammering their own rows would measure the dead versions of K hot
   rows rather than the route.
6. *live*: the same K threads and held runs, each POSTing the runner's
   live-log push (``/logs/live``, a snapshot of :data:`LIVE_ACTIVE_BYTES` of
   log text gzipped as runners/logbuf.py does) for its share in turn for
   ``--seconds``: pushes/s and server CPU per push. Then every record pushed
   must be in Redis with the bytes sent (the bench stops with an error
   otherwise: a push that is answered 204 but dropped would measure
   nothing), and the Redis memory of one record is read (``MEMORY USAGE``;
   the Redis server may be shared, so its INFO totals would not do).

The bench's own CPU (its client threads) is read too: under the table for
the highest K it prints what the calls ratio is made of (server and client
CPU per call of each phase, the ratio they predict, and the ratio if the
server's Python per call cost no more than a whole /healthz request).

Each figure is the median over the repetitions; the phases interleave, so a
neighbour's load on a shared machine falls on all of them alike. CPU is read
per process, so it stays meaningful when the machine is shared; wall-clock
rates do not.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from runners.logbuf import gzip_bytes
from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_lifecycle"
ROOT = Path(__file__).resolve().parents[2]

# The server modes, in ONE place: ``{port}`` is filled in. asgi is production's
# (README: gunicorn with uvicorn's worker on gantry.asgi, the default here);
# gthread the plain WSGI mode (2 workers x 8 threads, as the issue measured).
SERVER_MODES: dict[str, str] = {
    "gthread": "gunicorn gantry.wsgi -b 127.0.0.1:{port} --worker-class gthread --workers 2 --threads 8",
    "asgi": "gunicorn gantry.asgi -b 127.0.0.1:{port} --worker-class uvicorn_worker.UvicornWorker --workers 2",
    # The same, the lane's one-statement calls on the request threads as before
    # they moved to the event loop (GANTRY_FAST_LANE_LOOP): for an A/B on one host.
    "asgi-threads": "env GANTRY_FAST_LANE_LOOP=false gunicorn gantry.asgi -b 127.0.0.1:{port} "
    "--worker-class uvicorn_worker.UvicornWorker --workers 2",
}

CALLS = ("poll", "ready", "accept", "status", "done", "deregister")
SPEC = {"steps": [{"name": "bench", "run": "true"}]}
# What runners/client.py sends: the host metadata, and the end with its log manifest.
READY_BODY = {"hostname": "bench-host", "launcher": "local", "pid": 4242}
DONE_BODY = {
    "outcome": "succeeded",
    "exit_code": 0,
    "sealed_chunks": 1,
    "manifest": {"count": 1, "sha256": ["ab" * 32]},
}
HUGE = 1_000_000
# Runners per calling thread in the /status phase (each thread cycles over its share).
HELD_PER_RUNNER = 64
BENCH_RUNS_PER_HOUR = 100_000_000

WARM_UP_SECONDS = 3.0

# The active chunk a live push carries a snapshot of. The runner pushes the
# whole active chunk (not what is new) every GANTRY_LIVE_LOG_INTERVAL while it
# changes, and seals it at the latest after SEAL_INTERVAL (30 s,
# gantry_wire/protocol.py): a step printing about 1 KiB/s pushes a chunk that
# is on average half of 30 KiB. 16 KiB of log lines gzip (level 1, as the
# runner does) to a few KB, well under the fast lane's MAX_BODY (64 KiB,
# gantry/server/lane.py), past which Django reads the body instead.
LIVE_ACTIVE_BYTES = 16 * 1024
# The active chunk's number, and the chunks sealed before it (all uploaded).
LIVE_CHUNK_INDEX = 3

TARGET_CPU_PER_RUN_MS = 15.0
TARGET_CALLS_RATIO = 0.5
TARGET_STATUS_VS_HEALTHZ = 2.0


def _log_text(size: int) -> bytes:
    """``size`` bytes of build-like output: timestamps, paths, counters and hashes that do not repeat.

    Seeded, so every round pushes the same bytes; varied, so gzip does not
    shrink it more than a real step's output (a constant line would gzip
    ~100x and understate the push's body).
    """
    rng = random.Random(23)
    lines: list[str] = []
    total = 0
    while total < size:
        n = len(lines)
        kind = n % 4
        stamp = f"2026-01-01T12:{n // 60 % 60:02d}:{n % 60:02d}.{rng.randrange(1000):03d}Z"
        r = rng.randrange
        if kind == 0:
            line = f"{stamp} compiling src/pkg_{r(40)}/mod_{r(900)}.py"
        elif kind == 1:
            line = f"{stamp} tests/test_{r(120)}.py::test_case_{r(5000)} PASSED [{r(100):3d}%] {rng.random():.3f}s"
        elif kind == 2:
            digest = f"{rng.getrandbits(128):032x}"
            line = f"{stamp} Downloading dep_{r(300)}-{r(9)}.{r(30)}.{r(20)}.tar.gz ({r(10, 9000)} kB) sha256={digest}"
        else:
            line = f"{stamp} warning: unused variable 'v{r(100)}' [-Wunused] at line {r(2000)}"
        lines.append(line)
        total += len(line) + 1
    return ("\n".join(lines) + "\n").encode()[:size]


def live_snapshot() -> bytes:
    """The gzip a runner pushes for an active chunk of :data:`LIVE_ACTIVE_BYTES` (runners/logbuf.py's gzip)."""
    return gzip_bytes(_log_text(LIVE_ACTIVE_BYTES))


# --------------------------------------------------------------------------- loading

_LOAD_SQL = """
WITH s AS (
    INSERT INTO stack (organization_id, name, labels, spec, secrets, created_at)
    SELECT %(org)s, 'b-' || g, '{}'::jsonb, NULL, '{}'::jsonb, %(base)s
    FROM generate_series(1, %(n)s) g
    RETURNING id, name
),
d AS (
    INSERT INTO deployment (stack_id, status, created_by_id, spec, created_at, updated_at)
    SELECT s.id, 'queued', NULL, %(spec)s::jsonb, %(base)s, %(base)s FROM s
    RETURNING id, stack_id
)
INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector, selector_id,
                 first_pending_at, failure_reason, sealed_chunks, created_at, updated_at)
SELECT gen_random_uuid(), %(org)s, d.stack_id, d.id, 1, 'pending', '{}'::jsonb, %(selector)s,
       %(base)s + d.stack_id * interval '1 microsecond', '', 0, %(base)s, %(base)s
FROM d
"""


@dataclass
class Fleet:
    group_id: int
    group_token: str


def setup_org() -> Fleet:
    """An empty Gantry: one org, one self-hosted group that never fills, the empty selector."""
    from gantry.core import tokens
    from gantry.core.models import Organization, RunnerGroup, RunSelector

    execute(
        "TRUNCATE run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, organization "
        "CASCADE"
    )
    org = Organization.objects.create(slug="bench-lifecycle", name="bench", runs_per_hour_limit=BENCH_RUNS_PER_HOUR)
    group = RunnerGroup.objects.create(organization=org, name="bench", labels={}, max_concurrent_runs=HUGE)
    RunSelector.objects.create(organization=org, selector={})
    return Fleet(
        group.id,
        tokens.mint_group_token(
            group_id=group.id, token_version=group.token_version, organization_id=group.organization_id
        ),
    )


def load_runs(n: int) -> None:
    """Replace every run with ``n`` fresh pending ones (and vacuum, as autovacuum would between bursts)."""
    from django.utils import timezone

    from gantry.core.models import Organization, RunSelector

    org = Organization.objects.get(slug="bench-lifecycle")
    execute("TRUNCATE run_event, run_token, run, runner, deployment, stack CASCADE")
    execute("UPDATE runner_group SET runner_count = 0")
    base = timezone.now() - timedelta(hours=1)
    selector = RunSelector.objects.get(organization=org).id
    execute(_LOAD_SQL, {"org": org.id, "n": n, "spec": json.dumps(SPEC), "base": base, "selector": selector})
    execute("VACUUM (ANALYZE) run, stack, deployment, runner, runner_group, run_event, run_token")


# --------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """The server under test, as a subprocess (its whole process tree is measured)."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.command = command.format(port=self.port)
        venv_bin = str(Path(sys.executable).parent)
        full_env = {**os.environ, **env, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
        self.proc = subprocess.Popen(
            shlex.split(self.command),
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise SystemExit("server did not answer /healthz within 30 s")
        # Every worker has imported Django by now only if each answered once: warm them.
        time.sleep(1.0)

    def pids(self) -> list[int]:
        out = [self.proc.pid]
        queue = [self.proc.pid]
        while queue:
            pid = queue.pop()
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                out.append(child)
                queue.append(child)
        return out

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _backend_pids(database: str) -> list[int]:
    """PostgreSQL backends connected to ``database``, but the bench's own (the server is on this host)."""
    rows = execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [database])
    return [int(pid) for (pid,) in rows]


@dataclass
class CpuMeter:
    server: Server
    database: str
    _start: dict[str, dict[int, float]] = field(default_factory=dict)

    def _read(self) -> dict[str, dict[int, float]]:
        return {
            "py": {pid: _cpu_seconds(pid) for pid in self.server.pids()},
            "pg": {pid: _cpu_seconds(pid) for pid in _backend_pids(self.database)},
        }

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, float]:
        """CPU seconds since start, by side (a process that started meanwhile counts from zero)."""
        end = self._read()
        return {side: sum(cpu - self._start[side].get(pid, 0.0) for pid, cpu in end[side].items()) for side in end}


# --------------------------------------------------------------------------- the simulated runners


class Client:
    """One keep-alive HTTP connection; every call timed."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, token: str | None, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, resp.read()


@dataclass
class PhaseResult:
    seconds: float
    runs: int = 0
    calls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    empty_polls: int = 0
    # Paths each answered as expected at least once (the live phase checks their records).
    answered: set[str] = field(default_factory=set)

    @property
    def n_calls(self) -> int:
        return sum(len(v) for v in self.calls.values())


def _timed(
    out: dict[str, list[float]],
    name: str,
    client: Client,
    method: str,
    path: str,
    token: str,
    body: dict[str, Any] | None,
    ok: int,
) -> bytes:
    t0 = time.perf_counter()
    status, answer = client.call(method, path, token, body)
    out[name].append(time.perf_counter() - t0)
    if status != ok:
        raise RuntimeError(f"{name} answered {status}: {answer[:300]!r}")
    return answer


def _lifecycle_loop(port: int, fleet: Fleet, deadline: float, res: PhaseResult, lock: threading.Lock) -> None:
    client = Client(port)
    calls: dict[str, list[float]] = defaultdict(list)
    runs = empties = 0
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            status, body = client.call("GET", "/api/v1/runner-groups/poll?wait=0", fleet.group_token)
            calls["poll"].append(time.perf_counter() - t0)
            if status == 204:
                empties += 1
                if empties > 50:
                    break  # the pre-queued runs are used up
                continue
            if status != 200:
                raise RuntimeError(f"poll answered {status}: {body[:300]!r}")
            claim = json.loads(body)
            run, runner, tok = claim["run_id"], claim["runner_id"], claim["runner_token"]
            steps = (
                ("ready", "POST", f"/api/v1/runners/{runner}/ready", READY_BODY, 204),
                ("accept", "POST", f"/api/v1/runs/{run}/accept", None, 200),
                ("status", "GET", f"/api/v1/runs/{run}/status", None, 200),
                ("done", "POST", f"/api/v1/runs/{run}/done", DONE_BODY, 204),
                ("deregister", "DELETE", f"/api/v1/runners/{runner}/deregister", None, 204),
            )
            for name, method, path, payload, ok in steps:
                _timed(calls, name, client, method, path, tok, payload, ok)
            runs += 1
    except Exception as exc:  # reported, never hidden: a failing call invalidates the phase
        with lock:
            res.errors.append(repr(exc))
    with lock:
        res.runs += runs
        res.empty_polls += empties
        for k, v in calls.items():
            res.calls[k].extend(v)


def _repeat_loop(
    port: int,
    targets: Sequence[tuple[str, str | None]],
    deadline: float,
    res: PhaseResult,
    lock: threading.Lock,
    name: str,
    body: dict[str, Any] | None = None,
) -> None:
    """Call each of ``targets`` (path, token) in turn until the deadline: GET expecting 200, or POST ``body``
    expecting 204."""
    client = Client(port)
    method, ok = ("GET", 200) if body is None else ("POST", 204)
    times: list[float] = []
    i = 0
    try:
        while time.perf_counter() < deadline:
            path, token = targets[i % len(targets)]
            t0 = time.perf_counter()
            status, answer = client.call(method, path, token, body)
            times.append(time.perf_counter() - t0)
            if status != ok:
                raise RuntimeError(f"{path} answered {status}: {answer[:300]!r}")
            i += 1
    except Exception as exc:
        with lock:
            res.errors.append(repr(exc))
    with lock:
        res.calls[name].extend(times)
        res.answered.update(path for path, _ in targets[: min(i, len(targets))])


def _phase(meter: CpuMeter, k: int, seconds: float, target: Callable[..., None], *args: Any) -> PhaseResult:
    """K threads running ``target(*args, deadline, result, lock)`` for ``seconds``, the server's CPU metered."""
    return _threads(meter, seconds, target, [args] * k)


def _threads(
    meter: CpuMeter, seconds: float, target: Callable[..., None], per_thread: list[tuple[Any, ...]]
) -> PhaseResult:
    """One thread per entry of ``per_thread``, each ``target(*entry, deadline, result, lock)``."""
    res = PhaseResult(seconds=seconds)
    lock = threading.Lock()
    meter.start()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    client0 = time.process_time()
    threads = [threading.Thread(target=target, args=(*args, deadline, res, lock)) for args in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res.seconds = time.perf_counter() - t0
    res.cpu = meter.stop()
    # The bench's own CPU (its K client threads): it shares the host's cores
    # with the server, so it is part of what the calls ratio is made of.
    res.cpu["client"] = time.process_time() - client0
    return res


def hold_runs(fleet: Fleet, n: int) -> list[tuple[str, str]]:
    """``n`` of the loaded runs made running on busy runners of their own, as accept leaves them; (run, token) each.

    Written with SQL, not through the API: the /status phase wants many
    runners, each calling as a fleet's would (every few seconds), not a few
    runners hammering their own row (which would measure the dead row
    versions of one hot row, not the route).
    """
    from gantry.core import tokens

    runs = [r for (r,) in execute("SELECT id FROM run WHERE status = 'pending' ORDER BY first_pending_at DESC LIMIT %s",
                                  [n])]  # fmt: skip
    pairs = [(run, uuid.uuid4()) for run in runs]
    for run, runner in pairs:
        execute(
            "INSERT INTO runner (id, runner_group_id, status, created_at, ready_at, accepted_at, last_seen_at, "
            "hostname, launcher, container_id, pod_name) "
            "VALUES (%s, %s, 'busy', now(), now(), now(), now(), 'bench', 'bench', '', '')",
            [runner, fleet.group_id],
        )
        execute(
            "UPDATE run SET status = 'running', assigned_runner_id = %s, assigned_at = now(), started_at = now(), "
            "updated_at = now() WHERE id = %s",
            [runner, run],
        )
    execute("VACUUM (ANALYZE) run, runner")
    return [
        (str(run), tokens.mint_runner_token(runner_id=runner, run_id=run, group_id=fleet.group_id))
        for run, runner in pairs
    ]


def _status_phase(meter: CpuMeter, port: int, held: list[tuple[str, str]], k: int, seconds: float) -> PhaseResult:
    """K threads, each calling /status for its share of the held runs in turn."""
    targets = [(f"/api/v1/runs/{run}/status", tok) for run, tok in held]
    return _threads(meter, seconds, _status_loop, [(port, targets[i::k]) for i in range(k)])


def _status_loop(port: int, share: Sequence[tuple[str, str | None]], deadline: float, res: PhaseResult,
                 lock: threading.Lock) -> None:  # fmt: skip
    _repeat_loop(port, share, deadline, res, lock, "status")


def _live_path(run: str) -> str:
    return f"/api/v1/runs/{run}/logs/live"


def _live_phase(
    meter: CpuMeter, port: int, held: list[tuple[str, str]], k: int, seconds: float, snapshot: bytes
) -> PhaseResult:
    """K threads, each pushing the live log of its share of the held runs in turn (the body runners/logbuf.py
    sends: the active chunk's number, the chunks sealed, the base64 of its gzip)."""
    body = {
        "chunk_index": LIVE_CHUNK_INDEX,
        "sealed_chunks": LIVE_CHUNK_INDEX,
        "data": base64.b64encode(snapshot).decode("ascii"),
    }
    targets = [(_live_path(run), tok) for run, tok in held]
    return _threads(meter, seconds, _live_loop, [(port, targets[i::k], body) for i in range(k)])


def _live_loop(port: int, share: Sequence[tuple[str, str | None]], body: dict[str, Any], deadline: float,
               res: PhaseResult, lock: threading.Lock) -> None:  # fmt: skip
    _repeat_loop(port, share, deadline, res, lock, "live", body)


def live_records(held: list[tuple[str, str]], pushed: set[str], snapshot: bytes) -> int:
    """Check that every run pushed has its live record in Redis, as sent; answer one record's bytes in Redis.

    Then drop the records: the next round's held runs are new ones, and the
    records would otherwise pile up for their TTL in the bench's Redis database.
    Raises SystemExit when a record is missing or differs: the server answered
    204 but dropped the push, and the phase's figures measured no write.
    """
    from gantry.logs import live
    from gantry.redis import client

    runs = [uuid.UUID(run) for run, _ in held if _live_path(run) in pushed]
    if not runs:
        raise SystemExit("live phase: no push was answered 204")
    records = live.get_many(runs)
    wrong = [run for run, rec in records.items()
             if rec is None or rec.data != snapshot or rec.chunk_index != LIVE_CHUNK_INDEX]  # fmt: skip
    if wrong:
        raise SystemExit(
            f"live phase: {len(wrong)} of {len(runs)} runs pushed (204) have no live record in Redis as sent, "
            f"e.g. {live.KEY.format(run_id=wrong[0])}"
        )
    # SAMPLES 0: the whole value, not an estimate.
    size = int(client().memory_usage(live.KEY.format(run_id=runs[0]), samples=0) or 0)
    live.delete_many(runs)
    return size


# --------------------------------------------------------------------------- figures


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


@dataclass
class Round:
    k: int
    life: PhaseResult
    health: PhaseResult
    status: PhaseResult
    live: PhaseResult
    live_record_bytes: int  # Redis MEMORY USAGE of one live record

    def live_per_s(self) -> float:
        return self.live.n_calls / self.live.seconds

    def runs_per_s(self) -> float:
        return self.life.runs / self.life.seconds

    def calls_per_s(self) -> float:
        return self.life.n_calls / self.life.seconds

    def health_per_s(self) -> float:
        return self.health.n_calls / self.health.seconds

    def cpu_per_run_ms(self, side: str) -> float:
        return self.life.cpu[side] / max(1, self.life.runs) * 1000

    def cpu_per_req_ms(self, phase: PhaseResult, side: str | None = None) -> float:
        """Server CPU per request (Python + PostgreSQL), or one side's: ``py``, ``pg`` or ``client`` (the bench's)."""
        total = phase.cpu[side] if side else phase.cpu["py"] + phase.cpu["pg"]
        return total / max(1, phase.n_calls) * 1000


def _median(rounds: list[Round], fn: Callable[[Round], float]) -> float:
    return statistics.median(fn(r) for r in rounds)


def report(rounds: list[Round], command: str) -> bool:
    print(f"\nserver: {command}")
    print(f"cpus={os.cpu_count()}, load average now {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ks = sorted({r.k for r in rounds})
    print(f"medians of {len(rounds) // len(ks)} repetitions\n")
    print(
        "| K | runs/s | CPU/run ms (py + pg) | CPU/run in healthz requests | lifecycle calls/s | healthz req/s | "
        "ratio | healthz CPU/req ms | status CPU/req ms (py + pg) | status ÷ healthz | "
        "live CPU/push ms (py + pg) | live pushes/s | Redis B/live record |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for k in ks:
        rs = [r for r in rounds if r.k == k]
        py = _median(rs, lambda r: r.cpu_per_run_ms("py"))
        pg = _median(rs, lambda r: r.cpu_per_run_ms("pg"))
        tot = _median(rs, lambda r: r.cpu_per_run_ms("py") + r.cpu_per_run_ms("pg"))
        ratio = _median(rs, lambda r: r.calls_per_s() / r.health_per_s())
        hz = _median(rs, lambda r: r.cpu_per_req_ms(r.health))
        st = _median(rs, lambda r: r.cpu_per_req_ms(r.status))
        st_py = _median(rs, lambda r: r.cpu_per_req_ms(r.status, "py"))
        st_pg = _median(rs, lambda r: r.cpu_per_req_ms(r.status, "pg"))
        st_ratio = _median(rs, lambda r: r.cpu_per_req_ms(r.status) / r.cpu_per_req_ms(r.health))
        # A run's CPU counted in bare requests of the same server in the same
        # repetition: on a host whose speed drifts (a shared VM's does, by
        # tens of percent within minutes) this moves far less than the ms.
        units = _median(rs, lambda r: (r.cpu_per_run_ms("py") + r.cpu_per_run_ms("pg")) / r.cpu_per_req_ms(r.health))
        lv = _median(rs, lambda r: r.cpu_per_req_ms(r.live))
        lv_py = _median(rs, lambda r: r.cpu_per_req_ms(r.live, "py"))
        lv_pg = _median(rs, lambda r: r.cpu_per_req_ms(r.live, "pg"))
        print(
            f"| {k} | {_median(rs, Round.runs_per_s):.1f} | {tot:.1f} ({py:.1f} + {pg:.1f}) | {units:.1f} | "
            f"{_median(rs, Round.calls_per_s):.0f} | {_median(rs, Round.health_per_s):.0f} | {ratio:.2f} | "
            f"{hz:.2f} | {st:.2f} ({st_py:.2f} + {st_pg:.2f}) | {st_ratio:.2f} | "
            f"{lv:.2f} ({lv_py:.2f} + {lv_pg:.2f}) | {_median(rs, Round.live_per_s):.0f} | "
            f"{_median(rs, lambda r: r.live_record_bytes):.0f} |"
        )
        if k == max(ks):
            _explain_ratio(rs, ratio)
            ok = tot <= TARGET_CPU_PER_RUN_MS and ratio >= TARGET_CALLS_RATIO and st_ratio <= TARGET_STATUS_VS_HEALTHZ
            print(
                f"\ntargets at K={k}: CPU/run {tot:.1f} ms (≤ {TARGET_CPU_PER_RUN_MS}): "
                f"{'PASS' if tot <= TARGET_CPU_PER_RUN_MS else 'FAIL'}; calls ratio {ratio:.2f} "
                f"(≥ {TARGET_CALLS_RATIO}): {'PASS' if ratio >= TARGET_CALLS_RATIO else 'FAIL'}; status ÷ healthz "
                f"CPU {st_ratio:.2f} (≤ {TARGET_STATUS_VS_HEALTHZ}): "
                f"{'PASS' if st_ratio <= TARGET_STATUS_VS_HEALTHZ else 'FAIL'}"
            )
    print("\nper call, ms, p50 / p99 (lifecycle phase; medians over repetitions)\n")
    print("| K | " + " | ".join(CALLS) + " | healthz |")
    print("|---" * (len(CALLS) + 2) + "|")
    for k in ks:
        rs = [r for r in rounds if r.k == k]
        cells = [_p50_p99(rs, c) for c in CALLS]
        hz_cell = _p50_p99(rs, "healthz", phase="health")
        print(f"| {k} | " + " | ".join(cells) + f" | {hz_cell} |")
    errors = [e for r in rounds for p in (r.life, r.health, r.status, r.live) for e in p.errors]
    if errors:
        print(f"\n{len(errors)} errors, first: {errors[0]}")
    return ok


def _explain_ratio(rounds: list[Round], measured: float) -> None:
    """What the calls ratio is made of, from CPU per call (printed under the table, for the highest K).

    Both phases keep the host's cores busy (server, PostgreSQL and the bench's
    client share them), so requests/s is about cores ÷ CPU per request and the
    ratio about (healthz server + client) ÷ (call server + client). The second
    figure is the ratio if the server's Python per call cost no more than a
    whole /healthz request: the part of the gap PostgreSQL's work alone makes.
    """

    def per(phase: str, side: str) -> float:
        return _median(rounds, lambda r: r.cpu_per_req_ms(getattr(r, phase), side))

    call_py, call_pg, call_cl = per("life", "py"), per("life", "pg"), per("life", "client")
    hz, hz_cl = _median(rounds, lambda r: r.cpu_per_req_ms(r.health)), per("health", "client")
    predicted = (hz + hz_cl) / (call_py + call_pg + call_cl)
    bound = (hz + hz_cl) / (hz + call_pg + call_cl)
    print(
        f"\nthe calls ratio from CPU: a lifecycle call costs {call_py + call_pg:.2f} ms of server CPU "
        f"(py {call_py:.2f} + pg {call_pg:.2f}) and {call_cl:.2f} of the bench's client; a /healthz request "
        f"{hz:.2f} + {hz_cl:.2f}. Predicted ratio {predicted:.2f} (measured {measured:.2f}); with the server's "
        f"Python per call no dearer than a whole /healthz request, PostgreSQL's {call_pg:.2f} ms a call would "
        f"leave it at {bound:.2f}."
    )


def _p50_p99(rounds: list[Round], call: str, phase: str = "life") -> str:
    def at(q: float) -> float:
        return statistics.median(_pct(getattr(r, phase).calls[call], q) for r in rounds)

    return f"{at(0.5):.1f} / {at(0.99):.1f}"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=SERVICES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ks", type=_ints, default=[1, 4, 16], help="concurrent runners (default 1,4,16)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per phase (default 8)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; figures are medians (default 3)")
    parser.add_argument("--runs", type=int, default=4000, help="pending runs loaded before each lifecycle phase")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--mode", choices=sorted(SERVER_MODES), default="asgi", help="a production server mode")
    mode.add_argument("--server-cmd", help="the server command instead, with {port} for its port")
    args = parser.parse_args(argv)

    url = database_url(DEFAULT_DATABASE_URL)
    bootstrap(url)
    database = unquote(urlsplit(url).path.lstrip("/"))
    fleet = setup_org()
    command = args.server_cmd or SERVER_MODES[args.mode]
    from django.conf import settings

    env = {
        "DATABASE_URL": url,
        "REDIS_URL": os.environ["REDIS_URL"],  # the bench's own Redis database (bootstrap)
        "GANTRY_REDIS_DB": os.environ["GANTRY_REDIS_DB"],
        "GANTRY_SECRET_KEY": settings.SECRET_KEY,
        "DJANGO_SETTINGS_MODULE": "gantry.settings",
    }
    snapshot = live_snapshot()
    print(
        f"live push: an active chunk of {LIVE_ACTIVE_BYTES} bytes of log text, {len(snapshot)} bytes of gzip, "
        f"{len(base64.b64encode(snapshot))} of base64",
        flush=True,
    )
    server = Server(command, env)
    meter = CpuMeter(server, database)
    rounds: list[Round] = []
    try:
        # Unmeasured: at the highest K the connection pools grow to their
        # working size, and each new backend connects, PREPAREs and plans its
        # statements (20-30 ms of PostgreSQL CPU each). A server in service
        # has done that long ago; counted in the first round, it added about
        # 0.5 ms to each run's figure.
        # The held runs come out of the loaded ones: load them on top of
        # --runs, or at a large K the status phase's holding leaves the
        # lifecycle phase nothing to claim (K=64 holds 4,096).
        load_runs(args.runs + HELD_PER_RUNNER * max(args.ks))
        hold_runs(fleet, HELD_PER_RUNNER * max(args.ks))
        _phase(meter, max(args.ks), WARM_UP_SECONDS, _lifecycle_loop, server.port, fleet)
        for rep in range(args.repeat):
            for k in args.ks:
                load_runs(args.runs + HELD_PER_RUNNER * k)
                held = hold_runs(fleet, HELD_PER_RUNNER * k)
                life = _phase(meter, k, args.seconds, _lifecycle_loop, server.port, fleet)
                health = _phase(meter, k, args.seconds, _repeat_loop_args(server.port, "/healthz", None, "healthz"))
                status = _status_phase(meter, server.port, held, k, args.seconds)
                pushes = _live_phase(meter, server.port, held, k, args.seconds, snapshot)
                record_bytes = (
                    live_records(held, pushes.answered, snapshot) if pushes.answered or not pushes.errors else 0
                )
                r = Round(k, life, health, status, pushes, record_bytes)
                rounds.append(r)
                print(
                    f"rep {rep + 1} K={k:>2}: {r.runs_per_s():6.1f} runs/s, "
                    f"{r.cpu_per_run_ms('py'):5.1f} + {r.cpu_per_run_ms('pg'):4.1f} ms CPU/run, "
                    f"healthz {r.health_per_s():6.0f}/s at {r.cpu_per_req_ms(r.health):.2f} ms, "
                    f"status {r.cpu_per_req_ms(r.status):.2f} ms CPU/req, "
                    f"live {r.live_per_s():6.0f} pushes/s at {r.cpu_per_req_ms(r.live):.2f} ms CPU/push "
                    f"({record_bytes} B a record in Redis), "
                    f"errors {len(life.errors) + len(health.errors) + len(status.errors) + len(pushes.errors)}",
                    flush=True,
                )
    finally:
        server.stop()
    report(rounds, server.command)
    return 0


def _repeat_loop_args(port: int, path: str, token: str | None, name: str) -> Callable[..., None]:
    def loop(deadline: float, res: PhaseResult, lock: threading.Lock) -> None:
        _repeat_loop(port, [(path, token)], deadline, res, lock, name)

    return loop


if __name__ == "__main__":
    sys.exit(main())
