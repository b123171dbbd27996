"""End-to-end latency benchmark: a deployment POSTed to a real server, run by a real coordinator and local runners.

Usage (from the repository root, with the virtualenv)::

    python -m tests.bench.e2e_latency [--runs 30] [--burst 30] [--max-parallel 8] [--warm N]
                                      [--mode asgi|gthread] [--step "echo hi"]

The server is the lifecycle benchmark's (tests/bench/lifecycle.py, ``SERVER_MODES``: gunicorn with uvicorn's
worker on gantry.asgi by default), the coordinator is ``python -m runners.coordinator --launcher local`` against
it, and every run is a real ephemeral runner process running the step ``--step``. Database and Redis as every
benchmark's (tests/bench/common.py; default database ``gantry_bench_e2e``, its Gantry tables TRUNCATEd).

Two scenarios, each with a fresh coordinator:

- *sequential*: ``--runs`` deployments one after another, each POSTed once the previous one has succeeded;
- *burst*: ``--burst`` runs queued at once (one stack each: a stack runs one deployment at a time), the
  coordinator at ``--max-parallel``: the group is drained, the deployments are POSTed (each with its reader),
  and then the group is undrained, which releases the whole queue at one instant (its NOTIFY wakes the
  coordinator's parked poll). The drain rate is runs / (last finished - release). POSTing is kept out of the
  window: the bench's one client POSTs in turn, and timed from the first POST the rate would be the client's.

With ``--warm N`` (N > 0) both scenarios run three times in the same invocation: "cold" (no flag), "warm" (the
coordinator started with ``--warm N``, which keeps N runners started and waiting, forked from the local launcher's
zygote) and "warm fresh" (the same with ``--launcher-option warm_fork=false``: each warm runner a fresh
interpreter). A coordinator that does not know the flag or the option exits at once; those rows then say so.

For each run, measured from the client's clock just before its deployment POST (in a burst: from the release):

- *running*: the run's ``started_at`` (the accept) as the run answer gives it, on the same host's clock;
- *output*: when a following reader first sees the step's output in ``GET /api/v1/runs/{id}/logs``: a reader
  that starts with the POST and reads until the line appears. When the server's schema (schema/openapi.yaml)
  offers ``wait`` on that read (a long poll), the reader waits on it; otherwise it polls every
  :data:`POLL_SECONDS` (sequential) or reads the burst's runs in turn, one thread (a thread each polling would
  load the two cores it measures);
- *succeeded*: the run's ``finished_at``.

Printed: p50 and p90 of each (ms) per mode and scenario, and for the burst its drain rate and the machine's CPU
per run while it drained (busy CPU time in /proc/stat from the release to the last run's end, every process on
the host, the bench's client included, divided by the runs: on a machine the burst saturates, the drain rate is
the cores divided by it). A measurement, not a test:
it exits 0 unless a run did not succeed. Reading and figures: docs/performance.md ("End-to-end latency").
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.common import SERVICES_HELP, bootstrap, database_url, execute
from tests.bench.lifecycle import ROOT, SERVER_MODES, Server

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_e2e"
# A polling reader's interval: fine enough for the 0.5 s goal, coarse enough not to load the server much.
POLL_SECONDS = 0.05
# A long-polling reader's wait per read (when the server offers ``wait``).
LOG_WAIT_SECONDS = 5
# How long one run may take before the bench gives up on it.
RUN_DEADLINE = 60.0
BENCH_RUNS_PER_HOUR = 100_000_000


@dataclass
class Gantry:
    """The org, its admin's API token and its group's token, as the bench set them up."""

    org_id: int
    user_token: str
    group_token: str
    group_id: int


def setup() -> Gantry:
    """An empty Gantry with one org, an admin with an API token (no superuser: common.py refuses those), a group."""
    from django.contrib.auth.models import User

    from gantry.core import services
    from gantry.core.models import Membership, Organization, Role

    execute(
        "TRUNCATE run_event, run_token, run, runner, deployment, stack, run_selector, runner_group, membership, "
        "organization CASCADE"
    )
    User.objects.filter(username="bench-e2e").delete()
    org = services.org_create(slug="bench-e2e", name="bench e2e")
    Organization.objects.filter(id=org.id).update(runs_per_hour_limit=BENCH_RUNS_PER_HOUR)
    user = User.objects.create_user("bench-e2e", password=None)
    Membership.objects.create(user=user, organization=org, role=Role.ADMIN)
    group, group_token = services.runner_group_create(org=org, name="bench", labels={}, max_concurrent_runs=1000)
    return Gantry(org.id, services.api_token_regenerate(user=user), group_token, group.id)


def set_drained(g: Gantry, drained: bool) -> None:
    """Hold the group's queue (drained: its polls take nothing) or release it (undrained: parked polls wake)."""
    from gantry.core import services
    from gantry.core.models import RunnerGroup

    services.runner_group_set_drained(group=RunnerGroup.objects.get(id=g.group_id), drained=drained)


def wait_finished(runs: list[Timed], give_up: float) -> None:
    """Until every run has ended (read in the bench's process: no server request in the measured window)."""
    from gantry.core.models import Run

    ids = [t.run_id for t in runs]
    while Run.objects.filter(id__in=ids, finished_at__isnull=True).exists() and time.monotonic() < give_up:
        time.sleep(0.02)


def make_stacks(g: Gantry, n: int, step: str) -> list[int]:
    from gantry.core import services
    from gantry.core.models import Organization

    org = Organization.objects.get(id=g.org_id)
    spec = {"steps": [{"name": "bench", "run": step}], "env": {}, "timeout_seconds": 60}
    start = execute("SELECT count(*) FROM stack")[0][0]
    return [services.stack_create(org=org, name=f"s{start + i}", spec=spec).id for i in range(n)]


def log_wait_offered() -> bool:
    """Whether the log read takes ``wait`` (a long poll), as this checkout's API schema says."""
    text = (ROOT / "schema" / "openapi.yaml").read_text()
    start = text.find("operationId: runs_logs_read")
    end = text.find("operationId:", start + 1)
    return start >= 0 and "name: wait" in text[start:end]


class Api:
    """One keep-alive connection with the admin's token."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=RUN_DEADLINE)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Token {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=RUN_DEADLINE)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


@dataclass
class Timed:
    """One run: seconds from its POST (client clock) to each mark; None when not seen."""

    posted: float
    run_id: str = ""
    output: float | None = None
    running: float | None = None
    succeeded: float | None = None
    status: str = ""


def post(api: Api, stack_id: int) -> Timed:
    posted = time.time()
    code, body = api.call("POST", f"/api/v1/stacks/{stack_id}/deployments", {})
    if code != 201:
        raise SystemExit(f"deployment POST answered {code}: {body}")
    return Timed(posted, str(body["run"]["id"]))


def _epoch(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


def finish(api: Api, t: Timed) -> None:
    """Wait for the run's end; fill running and succeeded from the run answer's own stamps."""
    deadline = time.monotonic() + RUN_DEADLINE
    while True:
        _, run = api.call("GET", f"/api/v1/runs/{t.run_id}")
        if run["finished_at"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    t.status = run["status"]
    for name, stamp in (("running", run["started_at"]), ("succeeded", run["finished_at"])):
        at = _epoch(stamp)
        setattr(t, name, None if at is None else at - t.posted)


def read_until(api: Api, t: Timed, marker: str, *, waits: bool, stop: Callable[[], bool]) -> None:
    """A following reader: read the log from 0 until ``marker`` shows; the time it first did."""
    path = f"/api/v1/runs/{t.run_id}/logs?offset=0" + (f"&wait={LOG_WAIT_SECONDS}" if waits else "")
    while not stop():
        code, page = api.call("GET", path)
        if code == 200 and marker in page["text"]:
            t.output = time.time() - t.posted
            return
        if code == 200 and page["final"]:
            return  # ended without the marker: no output to time
        if not waits:
            time.sleep(POLL_SECONDS)


def _past(deadline: float) -> bool:
    return time.monotonic() > deadline


def sequential(port: int, g: Gantry, stacks: list[int], marker: str, waits: bool) -> list[Timed]:
    api, reader = Api(port, g.user_token), Api(port, g.user_token)
    out = []
    for stack_id in stacks:
        t = post(api, stack_id)
        give_up = time.monotonic() + RUN_DEADLINE
        read_until(reader, t, marker, waits=waits, stop=partial(_past, give_up))
        finish(api, t)
        out.append(t)
    return out


def busy_seconds() -> float:
    """CPU time the whole machine has spent busy since boot (every core; /proc/stat's first line)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def burst(port: int, g: Gantry, stacks: list[int], marker: str, waits: bool) -> tuple[list[Timed], float, float]:
    """The burst's runs, its drain rate (runs/s) and the machine's CPU seconds per run while it drained."""
    api = Api(port, g.user_token)
    give_up = time.monotonic() + RUN_DEADLINE * 2
    runs: list[Timed] = []
    threads: list[threading.Thread] = []
    set_drained(g, True)
    for stack_id in stacks:
        runs.append(post(api, stack_id))
        if waits:
            # A reader per run from its POST on, as a person who queued it and opened its page: a long poll
            # parks on the server's event loop, so 30 of them hold no server thread.
            reader = threading.Thread(
                target=read_until, args=(Api(port, g.user_token), runs[-1], marker),
                kwargs={"waits": True, "stop": partial(_past, give_up)},
            )  # fmt: skip
            reader.start()
            threads.append(reader)
    time.sleep(0.5)  # the readers' first reads answered and parked
    release = time.time()
    for t in runs:
        t.posted = release  # every mark from the release: the runs were all queued at that instant
    cpu_before = busy_seconds()
    set_drained(g, False)
    if waits:
        for th in threads:
            th.join()
    else:
        poller = Api(port, g.user_token)
        left = list(runs)
        while left and time.monotonic() < give_up:
            for t in list(left):
                code, page = poller.call("GET", f"/api/v1/runs/{t.run_id}/logs?offset=0")
                if code == 200 and (marker in page["text"] or page["final"]):
                    if marker in page["text"]:
                        t.output = time.time() - t.posted
                    left.remove(t)
    wait_finished(runs, give_up)
    cpu = (busy_seconds() - cpu_before) / max(1, len(runs))
    for t in runs:
        finish(api, t)
    ends = [t.posted + t.succeeded for t in runs if t.succeeded is not None]
    drain = len(ends) / (max(ends) - release) if ends else 0.0
    return runs, drain, cpu


def _scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


@dataclass
class Coordinator:
    """``python -m runners.coordinator --launcher local`` against the bench's server, in its own session."""

    port: int
    token: str
    max_parallel: int
    warm: int = 0
    extra: tuple[str, ...] = ()
    tmp: Path = field(default_factory=lambda: _scratch("gantry-e2e-"))

    def start(self) -> bool:
        token_file = self.tmp / "token"
        token_file.write_text(self.token)
        cmd = [
            sys.executable, "-m", "runners.coordinator", "--server", f"http://127.0.0.1:{self.port}",
            "--token-file", str(token_file), "--launcher", "local", "--state-dir", str(self.tmp / "state"),
            "--max-parallel", str(self.max_parallel), "--wait", "30",
        ]  # fmt: skip
        if self.warm:
            cmd += ["--warm", str(self.warm)]
        cmd += self.extra
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GANTRY_", "DJANGO_", "DATABASE_", "REDIS_"))}
        self.log = (self.tmp / "coordinator.log").open("wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        time.sleep(1.5 + 0.2 * self.warm)  # its first poll parked, its warm runners (if any) started
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()

    def tail(self) -> str:
        return (self.tmp / "coordinator.log").read_text(errors="replace")[-600:]


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def row(label: str, runs: list[Timed], drain: float | None, cpu: float | None) -> str:
    cells = [f"{label:<24}", f"{len(runs):>4}"]
    for name in ("running", "output", "succeeded"):
        values = [getattr(t, name) * 1000 for t in runs if getattr(t, name) is not None]
        p50, p90 = pct(values, 0.5), pct(values, 0.9)
        cells.append(f"{'-' if p50 is None else f'{p50:.0f}':>7} {'-' if p90 is None else f'{p90:.0f}':>7}")
    cells.append(f"{'' if drain is None else f'{drain:.1f}':>8}")
    cells.append(f"{'' if cpu is None else f'{cpu * 1000:.0f}':>7}")
    return " | ".join(cells)


HEADER = (
    f"{'mode / scenario':<24} | {'runs':>4} | {'running p50':>7}/p90 | {'output p50':>6}/p90 | "
    f"{'done p50':>7}/p90 | {'runs/s':>8} | {'CPU/run':>7}"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=SERVICES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30, help="sequential runs (default 30)")
    parser.add_argument("--burst", type=int, default=30, help="runs queued at once (default 30; 0 skips)")
    parser.add_argument("--max-parallel", type=int, default=8, help="the coordinator's --max-parallel (default 8)")
    parser.add_argument("--warm", type=int, default=0,
                        help="also run warm: the coordinator with --warm N, forked and fresh")  # fmt: skip
    parser.add_argument("--mode", choices=sorted(SERVER_MODES), default="asgi")
    parser.add_argument("--step", default="echo hi", help="the step each run runs (default: echo hi)")
    parser.add_argument("--marker", default="hi", help="the output the reader waits for (default: hi)")
    args = parser.parse_args(argv)

    bootstrap(database_url(DEFAULT_DATABASE_URL))
    logs = Path(tempfile.mkdtemp(prefix="gantry-e2e-logs-"))
    server = Server(SERVER_MODES[args.mode], {"GANTRY_LOG_DIR": str(logs), "GANTRY_DATA_DIR": str(logs)})
    waits = log_wait_offered()
    g = setup()
    print(f"server {args.mode} on :{server.port}; step {args.step!r}; reader: "
          f"{'long poll (wait=' + str(LOG_WAIT_SECONDS) + ')' if waits else f'polling every {POLL_SECONDS} s'}",
          flush=True)  # fmt: skip
    lines, failed = [], 0
    try:
        modes: list[tuple[str, int, tuple[str, ...]]] = [("cold", 0, ())]
        if args.warm > 0:
            modes += [(f"warm {args.warm}", args.warm, ()),
                      (f"warm {args.warm} fresh", args.warm, ("--launcher-option", "warm_fork=false"))]  # fmt: skip
        for mode, warm, extra in modes:
            for scenario in ("sequential", "burst"):
                n = args.runs if scenario == "sequential" else args.burst
                if n <= 0:
                    continue
                stacks = make_stacks(g, n, args.step)
                coordinator = Coordinator(server.port, g.group_token, args.max_parallel, warm, extra)
                if not coordinator.start():
                    lines.append(f"{mode + ' ' + scenario:<24} | coordinator refused: {coordinator.tail().strip()}")
                    coordinator.stop()
                    continue
                try:
                    drain = cpu = None
                    if scenario == "sequential":
                        runs = sequential(server.port, g, stacks, args.marker, waits)
                    else:
                        runs, drain, cpu = burst(server.port, g, stacks, args.marker, waits)
                finally:
                    coordinator.stop()
                    shutil.rmtree(coordinator.tmp, ignore_errors=True)
                bad = [t for t in runs if t.status != "succeeded"]
                failed += len(bad)
                if bad:
                    print(f"{len(bad)} {scenario} runs did not succeed: {[t.status for t in bad][:5]}", flush=True)
                lines.append(row(f"{mode} {scenario}", runs, drain, cpu))
                print(lines[-1], flush=True)
    finally:
        server.stop()
        shutil.rmtree(logs, ignore_errors=True)
    print()
    print("ms from the deployment POST, in a burst from the queue's release (p50 p90); runs/s: the burst's drain")
    print("rate; CPU/run: the machine's while the burst drained, ms")
    print(HEADER)
    for line in lines:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
