"""Drives one chaos run: boots the stack, plays the plan (deployments and faults), waits, reads everything back.

The outcome is a :class:`Outcome` the checks in ``test_chaos.py`` judge. The
test process talks to Gantry through its public API (as a user would) and
reads the private database directly only for what no API answers at an
instant: which runs are executing right now (to aim a runner kill) and
whether a lane is stuck (sampled every couple of seconds).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import secrets
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from runners.client import NO_RETRY, ApiError, GantryClient, RetryPolicy
from tests.chaos.harness import Gantry, Postgres, Redis, Supervisor, gantry_env, manage, wait_for
from tests.chaos.schedule import Fault, Plan, Submit

# Shortened failure windows (gantry/conf.py), so every recovery path completes within the test.
TIMINGS = {
    "GANTRY_REAPER_INTERVAL": 2,
    "GANTRY_ASSIGNMENT_TTL": 8,
    "GANTRY_STUB_CUTOFF": 15,  # must exceed the lease (conf.check())
    "GANTRY_RUNNER_EXECUTION_TIMEOUT": 8,
    "GANTRY_RUNNER_STARTUP_DEADLINE": 90,
    "GANTRY_RUNNER_FORCE_GATE": 8,  # at least the lease (conf.check)
    "GANTRY_STATUS_INTERVAL": 1,
    "GANTRY_LIVE_LOG_INTERVAL": 1,
}
SPEC_TIMEOUT = 60
# Longer than the reaper interval: beat sends at least one tick into the outage.
REDIS_DOWN = 2.5
PROBES = 8
MAX_PARALLEL = 6
LINES = 20
LANE_HOLDERS = ("pending", "assigned", "running", "requested_cancellation", "cancelling")
TERMINAL = ("succeeded", "failure", "cancelled", "discarded", "startup_timeout")
# Patient retries for the test's own API calls: faults cut requests off by design.
PATIENT = RetryPolicy(attempts=100, base=0.2, cap=2.0, deadline=90.0)


def spec(exec_file: Path) -> dict[str, Any]:
    """Step 1 appends the run id to ``exec_file`` (so "executed twice" is countable); step 2 prints LINES lines."""
    return {
        "steps": [
            {"name": "mark", "run": f"echo $GANTRY_RUN_ID >> {exec_file}"},
            {
                "name": "work",
                "run": f'for i in $(seq 1 {LINES}); do echo "line $i of $GANTRY_RUN_ID"; sleep 0.05; done',
            },
        ],
        "timeout_seconds": SPEC_TIMEOUT,
    }


@dataclass(frozen=True)
class Recover:
    """A killed process's restart, queued ``pause`` seconds after its fault."""

    fault: Fault


@dataclass
class Outcome:
    plan: Plan
    tmp: Path
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id → GET /runs/{id}
    logs: dict[str, str] = field(default_factory=dict)  # run id → its whole log, read back
    log_errors: dict[str, str] = field(default_factory=dict)
    executions: Counter[str] = field(default_factory=Counter)  # run id → lines in the exec file
    faults: list[tuple[float, str, str]] = field(default_factory=list)  # (at, kind, target or "skipped: why")
    pg_outages: list[tuple[float, float]] = field(default_factory=list)  # wall-clock (stopped, answering again)
    redis_outages: list[tuple[float, float]] = field(default_factory=list)  # wall-clock (stopped, listening again)
    pg_probes: list[list[int]] = field(default_factory=list)  # statuses of the first reads after each restart
    stuck_lanes: list[tuple[float, int]] = field(default_factory=list)  # (when, stack id) queued behind no holder
    process_logs: dict[str, list[Path]] = field(default_factory=dict)  # process kind → its log files
    access_log: Path | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class Chaos:
    def __init__(self, plan: Plan, tmp: Path) -> None:
        self.plan = plan
        self.tmp = tmp
        self.rng = random.Random(plan.seed ^ 0x5EED)
        self.out = Outcome(plan, tmp)
        (tmp / "logs").mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(tmp / "logs")
        self.exec_file = tmp / "executed.txt"
        self.exec_file.touch()
        self.stack_ids: dict[str, int] = {}
        self.gantry: Gantry | None = None
        self.pg: Postgres | None = None

    # ------------------------------------------------------------ boot

    def boot(self) -> None:
        began = time.monotonic()
        self.pg = Postgres()
        with psycopg.connect(self.pg.url("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE gantry")
        self.redis = Redis(self.supervisor, self.tmp / "redis")
        self.redis.start()
        env = gantry_env(
            DATABASE_URL=self.pg.url("gantry"),
            REDIS_URL=self.redis.url,
            GANTRY_CELERY_QUEUE="gantry_chaos",
            GANTRY_SECRET_KEY=secrets.token_urlsafe(50),
            GANTRY_DATA_DIR=str(self.tmp / "data"),
            GANTRY_LOG_DIR=str(self.tmp / "chunks"),
            GANTRY_LOG_LEVEL="WARNING",
            **{k: str(v) for k, v in TIMINGS.items()},
        )
        manage(env, "migrate", "--noinput")
        manage(env, "shell", "-c", "from django.contrib.auth.models import User; "
               "User.objects.create_superuser('root', 'root@example.com', 'pw-root-chaos')")  # fmt: skip
        token = manage(env, "drf_create_token", "root").split("token ", 1)[1].split(" ", 1)[0]
        self.gantry = Gantry(self.supervisor, env, self.tmp)
        self.gantry.start_server()
        self.gantry.start_worker()
        self.api = GantryClient(self.gantry.url, token, scheme="Token", timeout=30, retry=PATIENT)
        self.api.request("POST", "/api/v1/orgs", body={"slug": "chaos", "name": "Chaos"})
        # The default budget is 2 runs an hour; this run queues 160 in a minute.
        self.api.request("PUT", "/api/v1/orgs/chaos/runs-per-hour-limit", body={"runs_per_hour_limit": 1_000_000})
        group = self.api.request(
            "POST", "/api/v1/orgs/chaos/runner-groups", body={"name": "chaos", "labels": {"chaos": "yes"}}
        ).json()
        token_file = self.tmp / "group-token"
        token_file.write_text(group["token"])
        token_file.chmod(0o600)
        for name in self.plan.stacks:
            body = {"name": name, "labels": {"gantry:runner-group:chaos": "yes"}, "spec": spec(self.exec_file)}
            self.stack_ids[name] = int(self.api.request("POST", "/api/v1/orgs/chaos/stacks", body=body).json()["id"])
        self.token_file = token_file
        self.gantry.start_coordinator(token_file, MAX_PARALLEL)
        self.out.seconds["boot"] = time.monotonic() - began

    # ------------------------------------------------------------ the plan

    def play(self) -> None:
        began = time.monotonic()
        queue: list[tuple[float, int, Submit | Fault | Recover]] = []
        for n, item in enumerate((*self.plan.submits, *self.plan.faults)):
            heapq.heappush(queue, (item.at, n, item))
        n = len(queue)
        next_sample = 0.0
        while queue:
            at, _, item = queue[0]
            now = time.monotonic() - began
            if now >= next_sample:
                self.sample_lanes()
                next_sample = now + 2.0
            if now < at:
                time.sleep(min(0.05, at - now))
                continue
            heapq.heappop(queue)
            if isinstance(item, Submit):
                self.submit(item)
            elif isinstance(item, Fault):
                self.strike(item, at)
                if item.pause:
                    n += 1
                    heapq.heappush(queue, (now + item.pause, n, Recover(item)))
            else:
                self.recover(item.fault)
        self.out.seconds["play"] = time.monotonic() - began

    def recover(self, fault: Fault) -> None:
        """Start again what ``fault`` killed, ``fault.pause`` seconds after."""
        assert fault.kind == "coordinator_kill", fault
        assert self.gantry is not None
        self.gantry.start_coordinator(self.token_file, MAX_PARALLEL)

    def submit(self, item: Submit) -> None:
        for _ in range(item.count):
            # Retried on a 5xx or a cut connection: a retry after a lost answer may
            # queue a second deployment, which the read-back counts like any other.
            self.api.request("POST", f"/api/v1/stacks/{self.stack_ids[item.stack]}/deployments", body={})

    def strike(self, fault: Fault, at: float) -> None:
        assert self.gantry is not None
        assert self.pg is not None
        target = "skipped: nothing to hit"
        if fault.kind == "runner_kill":
            target = self.kill_a_runner()
        elif fault.kind == "coordinator_kill":
            if self.supervisor.alive("coordinator"):
                self.supervisor.kill("coordinator")
                target = f"pid killed, back in {fault.pause}s"
        elif fault.kind == "redis_restart":
            stopped = time.time()
            self.redis.restart(down=REDIS_DOWN)
            self.out.redis_outages.append((stopped, time.time()))
            target = f"port {self.redis.port}"
        elif fault.kind == "postgres_restart":
            stopped = time.time()
            self.pg.restart()
            self.out.pg_outages.append((stopped, time.time()))
            # The issue-10 measure: the first requests once PostgreSQL answers again, not retried.
            probes = [self.probe() for _ in range(PROBES)]
            self.out.pg_probes.append(probes)
            target = f"down {self.out.pg_outages[-1][1] - stopped:.1f}s, then {PROBES} reads answered {probes}"
        elif fault.kind == "gunicorn_worker_kill":
            workers = self.gantry.gunicorn_workers()
            if workers:
                pid = self.rng.choice(workers)
                signal_pid(pid)
                target = f"worker pid {pid}"
        else:
            raise AssertionError(f"unknown fault kind {fault.kind!r}")
        self.out.faults.append((at, fault.kind, target))

    def probe(self) -> int:
        try:
            return self.api.request("GET", "/api/v1/orgs/chaos", retry=NO_RETRY).status
        except ApiError as exc:
            return exc.status

    def kill_a_runner(self) -> str:
        """SIGKILL a runner whose run is executing (waiting up to 5 s for one); answer the run id."""
        assert self.gantry is not None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            running = set(self.query("SELECT id::text FROM run WHERE status = 'running'") or [])
            candidates = sorted(run for run in self.gantry.runner_pids() if run in running)
            if candidates:
                run_id = self.rng.choice(candidates)
                pid = self.gantry.runner_pids().get(run_id)
                if pid:
                    signal_pid(pid)
                    return f"run {run_id}"
            time.sleep(0.2)
        return "skipped: no runner was executing"

    # ------------------------------------------------------------ watching the database

    def query(self, sql: str) -> list[Any] | None:
        """First column of each row; None when the database does not answer (it may be restarting)."""
        assert self.pg is not None
        try:
            with psycopg.connect(self.pg.url("gantry"), connect_timeout=2) as conn:
                return [row[0] for row in conn.execute(sql).fetchall()]  # type: ignore[arg-type]
        except psycopg.Error:
            return None

    def sample_lanes(self) -> None:
        holders = ", ".join(f"'{s}'" for s in LANE_HOLDERS)
        stuck = self.query(
            "SELECT stack_id FROM run GROUP BY stack_id HAVING count(*) FILTER (WHERE status = 'queued') > 0 "
            f"AND count(*) FILTER (WHERE status IN ({holders})) = 0"
        )
        self.out.stuck_lanes.extend((time.time(), int(s)) for s in stuck or [])

    def drain(self, timeout: float) -> None:
        """Wait until every run is terminal (or ``timeout``), still sampling the lanes."""
        began = time.monotonic()
        terminal = ", ".join(f"'{s}'" for s in TERMINAL)

        def settled() -> bool:
            self.sample_lanes()
            left = self.query(f"SELECT count(*) FROM run WHERE status NOT IN ({terminal})")
            return left == [0]

        with contextlib.suppress(AssertionError):  # the checks report which runs are not terminal
            wait_for(settled, timeout, "every run to be terminal", interval=1.0)
        self.out.seconds["drain"] = time.monotonic() - began

    # ------------------------------------------------------------ reading back

    def read_back(self) -> None:
        began = time.monotonic()
        for stack_id in self.stack_ids.values():
            for deployment in self.api.request("GET", f"/api/v1/stacks/{stack_id}/deployments").json():
                run_id = str(deployment["run"]["id"])
                self.out.runs[run_id] = self.api.request("GET", f"/api/v1/runs/{run_id}").json()
        for run_id, run in self.out.runs.items():
            if run["status"] in TERMINAL:
                try:
                    self.out.logs[run_id] = self.read_log(run_id)
                except (ApiError, AssertionError) as exc:
                    self.out.log_errors[run_id] = str(exc)
        for line in self.exec_file.read_text().split():
            self.out.executions[line] += 1
        self.out.seconds["read back"] = time.monotonic() - began

    def read_log(self, run_id: str) -> str:
        """The whole log through ``GET /runs/{id}/logs``, following ``next_offset`` until it is ``final``."""
        text, offset = [], 0
        for _ in range(1000):
            page = self.api.request("GET", f"/api/v1/runs/{run_id}/logs", query={"offset": offset}).json()
            text.append(page["text"])
            if page["final"]:  # complete, or a lost runner's log ending with its marker line
                return "".join(text)
            if page["next_offset"] == offset:
                time.sleep(0.5)  # a terminal run still being flushed
            offset = page["next_offset"]
        raise AssertionError(f"the log of run {run_id} never read as final")

    # ------------------------------------------------------------ the end

    def stop(self) -> None:
        self.supervisor.stop_all()
        if self.gantry is not None:
            self.gantry.kill_leftover_runners()
            runners = sorted((self.gantry.state_dir / "logs").glob("*.log"))
        else:
            runners = []
        if self.pg is not None:
            self.pg.shut_down(keep_log=self.tmp / "logs" / "postgres.log")
        logs = self.tmp / "logs"
        self.out.process_logs = {
            "server": [logs / "web.log"],
            "worker": [logs / "worker.log"],
            "coordinator": [logs / "coordinator.log"],
            "runners": runners,
        }
        self.out.access_log = self.tmp / "access.log"


def signal_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def run_chaos(plan: Plan, tmp: Path) -> Outcome:
    chaos = Chaos(plan, tmp)
    try:
        chaos.boot()
        chaos.play()
        chaos.drain(timeout=TIMINGS["GANTRY_RUNNER_STARTUP_DEADLINE"] + 60)
        chaos.read_back()
    finally:
        chaos.stop()
    (tmp / "outcome.json").write_text(
        json.dumps({"faults": chaos.out.faults, "pg_outages": chaos.out.pg_outages, "seconds": chaos.out.seconds})
    )
    return chaos.out
