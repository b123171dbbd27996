"""Gantry as a small cluster on one host, driven through its balancer while one process of each kind is killed.

The processes (docs/high-availability.md): two gunicorn web processes (the
production ASGI mode) behind haproxy; two Celery workers, each with beat
embedded; two backend dispatchers (``manage.py dispatcher``) for a
github_actions group, whose workflow runs the local GitHub of
``tests/github/fakes.py`` plays; two coordinators (local launcher), one per
self-hosted group, polling through haproxy. The runs are queued through the
balancer too, and every runner and workflow run reaches Gantry there.

This reuses the chaos run's driver (``tests/chaos/driver.py``): its plan
loop, its submissions, its drain and its read-back; only the boot, the
faults and the extra read-outs are the cluster's own. PostgreSQL is the test
settings' server (a database of the cluster's own, dropped at the end), Redis
a private ``redis-server``.
"""

from __future__ import annotations

import contextlib
import json
import random
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from runners.client import GantryClient
from tests.chaos import driver
from tests.chaos.driver import PATIENT, Chaos
from tests.chaos.harness import COORDINATOR_BACKOFF_CAP, Gantry, Redis, gantry_env, manage, wait_for
from tests.chaos.schedule import Fault, Plan, Submit
from tests.e2e.conftest import _admin_url, _ready
from tests.github.fakes import FakeGitHub, OidcIssuer
from tests.ha.balancer import Balancer, Request, auth_crc
from tests.ports import free_port

# At least 300 runs (issue 23): stacks per runner group, each queued DEPTH deployments. Groups a and b
# are self-hosted, each with its coordinator; gha is a github_actions group, the dispatchers'.
STACKS = {"a": 24, "b": 24, "gha": 12}
# A self-hosted group with nothing queued: its coordinator's poll is parked nearly all the time, so
# every web kill cuts a parked poll (the busy coordinators' polls mostly return a claim at once).
IDLE_GROUP = "idle"
DEPTH = 5
RUNS = sum(STACKS.values()) * DEPTH
# Deployments are queued over this many seconds; the kills fall inside it.
WINDOW = 40.0
# The coordinators of each self-hosted group, and how many runners each may run at once. Group b has
# two (several coordinators may serve one group); the idle group's only ever parks polls.
COORDINATORS = {
    "a": {"coordinator-a": 6},
    "b": {"coordinator-b1": 3, "coordinator-b2": 3},
    "idle": {"coordinator-idle": 1},
}
# One kill of each kind, then each again on the other replica; each is started again RESTART_AFTER later.
RESTART_AFTER = 3.0
# A web kill's target is chosen when it strikes: the web process a long poll is parked on.
KILLS = (
    (6.0, "web_kill", ""),
    (12.0, "worker_kill", "worker-a"),
    (18.0, "dispatcher_kill", "dispatcher-a"),
    (24.0, "web_kill", ""),
    (30.0, "worker_kill", "worker-b"),
    (36.0, "dispatcher_kill", "dispatcher-b"),
)
KINDS = ("web_kill", "worker_kill", "dispatcher_kill")
# The chaos run's shortened windows, with a longer lease: a workflow run boots a zipapp under load.
TIMINGS = {
    **driver.TIMINGS,
    "GANTRY_ASSIGNMENT_TTL": 15,
    "GANTRY_STUB_CUTOFF": 25,
    "GANTRY_RUNNER_FORCE_GATE": 15,
    "GANTRY_RUNNER_STARTUP_DEADLINE": 150,
    "GANTRY_DISPATCH_INTERVAL": 1,
}
OWNER, REPO, WORKFLOW = "acme-inc", "deploys", "gantry-runner.yml"
AUDIENCE = "gantry-ha"
POLL_PATH = "/api/v1/runner-groups/poll"


def plan(seed: int) -> Plan:
    rng = random.Random(seed)
    stacks = [f"{group}-{i:02d}" for group, count in STACKS.items() for i in range(count)]
    submits = [Submit(round(rng.uniform(0, WINDOW), 2), name, 1) for name in stacks for _ in range(DEPTH)]
    faults = [Fault(at, kind, RESTART_AFTER, target) for at, kind, target in KILLS]
    return Plan(seed, tuple(stacks), tuple(sorted(submits, key=lambda s: s.at)), tuple(faults))


@dataclass
class Kill:
    kind: str
    target: str
    at: float  # unix time of the SIGKILL


@dataclass
class ClusterOutcome:
    chaos: driver.Outcome
    kills: list[Kill] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)  # the balancer's log
    stats: list[dict[str, str]] = field(default_factory=list)  # haproxy's `show stat` at the end
    coordinator_crcs: dict[str, str] = field(default_factory=dict)  # crc32 of a group's token → its coordinators
    accepted_twice: dict[str, int] = field(default_factory=dict)  # run id → its `accepted` events, when > 1
    sweeps: dict[str, float] = field(default_factory=dict)  # reaper → sweeps, from the server's /metrics
    beat_ticks: dict[str, int] = field(default_factory=dict)  # worker → ticks its beat sent
    events: dict[str, int] = field(default_factory=dict)  # run_event kind → rows, for what the kills cost
    play_seconds: float = 0.0
    workflow_runs: int = 0


class Cluster(Chaos):
    def __init__(self, seed: int, tmp: Path) -> None:
        super().__init__(plan(seed), tmp)
        self.result = ClusterOutcome(self.out)
        self.database = ""
        self.admin_url = ""
        self.github: FakeGitHub | None = None
        self.issuer: OidcIssuer | None = None
        self.balancer: Balancer | None = None
        self.token_files: dict[str, Path] = {}  # coordinator → its group's token file
        self.web_ports: dict[str, int] = {}
        self.targets: dict[Fault, str] = {}  # what each fault killed
        self.pool: ThreadPoolExecutor | None = None
        self.submitted: list[Future[None]] = []
        self.max_parallel = {name: n for coordinators in COORDINATORS.values() for name, n in coordinators.items()}

    # ------------------------------------------------------------ boot

    def boot(self) -> None:
        from django.conf import settings

        began = time.monotonic()
        self.database = f"gantry_ha_{secrets.token_hex(4)}"
        self.admin_url = _admin_url(settings.DATABASE_URL, "postgres")
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self.redis = Redis(self.supervisor, self.tmp / "redis")
        self.redis.start()
        self.issuer = OidcIssuer()
        self.github = FakeGitHub(issuer=self.issuer, token="ghp_ha_token")
        self.github.add_repo(OWNER, REPO, WORKFLOW, 161)
        self.github.workdir = self.tmp / "actions"
        self.github.actions = True
        self.github.variables = {"GANTRY_OIDC_AUDIENCE": AUDIENCE}
        self.github.actions_env = {"GANTRY_STOP_GRACE": "3"}
        self.web_ports = {name: free_port() for name in ("web-a", "web-b")}
        self.metrics_token = secrets.token_urlsafe(32)
        self.balancer = Balancer(self.supervisor, self.tmp / "haproxy", dict(self.web_ports))
        base = gantry_env(
            DATABASE_URL=_admin_url(settings.DATABASE_URL, self.database),
            REDIS_URL=self.redis.url,
            GANTRY_CELERY_QUEUE="gantry_ha",
            GANTRY_SECRET_KEY=secrets.token_urlsafe(50),
            # Behind the balancer every scraper has its address: /metrics is read with the token (docs/queue.md).
            GANTRY_METRICS_TOKEN=self.metrics_token,
            GANTRY_DATA_DIR=str(self.tmp / "data"),
            GANTRY_LOG_DIR=str(self.tmp / "chunks"),
            GANTRY_LOG_LEVEL="WARNING",
            **{k: str(v) for k, v in TIMINGS.items()},
        )
        # Web and dispatchers know GitHub. The workers do not: with a credential, beat would also run a
        # dispatcher loop inside each worker, and the kills below would not be of one kind each.
        with_github = {
            **base,
            "GANTRY_GITHUB_API_URL": self.github.url,
            "GANTRY_GITHUB_TOKEN": "ghp_ha_token",
            "GANTRY_GITHUB_OIDC_ISSUER": self.issuer.url,
            "GANTRY_GITHUB_OIDC_AUDIENCE": AUDIENCE,
            "GANTRY_PUBLIC_URL": self.balancer.url,
        }
        manage(base, "migrate", "--noinput")
        manage(base, "shell", "-c", "from django.contrib.auth.models import User; "
               "User.objects.create_superuser('root', 'root@example.com', 'pw-root-ha')")  # fmt: skip
        token = manage(base, "drf_create_token", "root").split("token ", 1)[1].split(" ", 1)[0]
        self.gantry = Gantry(self.supervisor, with_github, self.tmp, port=self.web_ports["web-a"])
        for name, port in self.web_ports.items():
            self.gantry.start_server(1, name=name, port=port, asgi=True)
        for name, port in self.web_ports.items():
            # Ready before the balancer sends traffic: a cold process's first answers are slow.
            wait_for(lambda port=port: _ready(f"http://127.0.0.1:{port}"), 60, f"{name} to answer /readyz")
        self.balancer.start()
        wait_for(lambda: all(self.balancer_up(name) for name in self.web_ports), 30, "both web processes UP")
        for name in ("worker-a", "worker-b"):
            # INFO: beat's "Sending due task" lines show that both beats ticked.
            self.gantry.start_worker(name=name, env=base, loglevel="INFO")
        self.api = GantryClient(self.balancer.url, token, scheme="Token", timeout=30, retry=PATIENT)
        self.api.request("POST", "/api/v1/orgs", body={"slug": "ha", "name": "High availability"})
        self.api.request("PUT", "/api/v1/orgs/ha/runs-per-hour-limit", body={"runs_per_hour_limit": 1_000_000})
        for group in (*STACKS, IDLE_GROUP):
            body: dict[str, Any] = {"name": f"ha-{group}", "labels": {"ha": group}}
            if group == "gha":
                body |= {
                    "kind": "github_actions", "max_concurrent_runs": 1000, "github_owner": OWNER,
                    "github_repo": REPO, "github_workflow": WORKFLOW, "github_ref": "main",
                }  # fmt: skip
            made = self.api.request("POST", "/api/v1/orgs/ha/runner-groups", body=body).json()
            if group != "gha":
                path = self.tmp / f"token-{group}"
                path.write_text(made["token"])
                path.chmod(0o600)
                for name in COORDINATORS[group]:
                    self.token_files[name] = path
                # Polls are told apart by group: the coordinators of one group share its token.
                self.result.coordinator_crcs[auth_crc(f"Bearer {made['token']}")] = "+".join(COORDINATORS[group])
        for name in self.plan.stacks:
            group = name.rsplit("-", 1)[0]
            body = {"name": name, "labels": {"gantry:runner-group:ha": group}, "spec": driver.spec(self.exec_file)}
            self.stack_ids[name] = int(self.api.request("POST", "/api/v1/orgs/ha/stacks", body=body).json()["id"])
        for name in ("dispatcher-a", "dispatcher-b"):
            self.gantry.start_dispatcher(name=name)
        for name in self.token_files:
            self.start_coordinator(name)
        self.out.seconds["boot"] = time.monotonic() - began

    def balancer_up(self, server: str) -> bool:
        assert self.balancer is not None
        with contextlib.suppress(OSError):
            return self.balancer.up(server)
        return False

    def start_coordinator(self, name: str) -> None:
        assert self.gantry is not None
        assert self.balancer is not None
        self.gantry.start_coordinator(
            self.token_files[name],
            self.max_parallel[name],
            name=name,
            server=self.balancer.url,
            state_dir=self.tmp / name,
        )

    # ------------------------------------------------------------ the plan

    def play(self) -> None:
        """The chaos run's plan loop, with the deployments queued from a few threads: one at a time, the
        POSTs fell behind their schedule on busy cores, and the restarts queued after them came late."""
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="submit") as pool:
            self.pool = pool
            super().play()
        for future in self.submitted:
            future.result()

    def submit(self, item: Submit) -> None:
        assert self.pool is not None
        self.submitted.append(self.pool.submit(super().submit, item))

    # ------------------------------------------------------------ the faults

    def strike(self, fault: Fault, at: float) -> None:
        """SIGKILL the process and its children (its process group): a crash, not a stop."""
        target = fault.target or self.web_to_kill()
        self.targets[fault] = target
        self.result.kills.append(Kill(fault.kind, target, time.time()))
        self.supervisor.kill(target, group=True)
        self.out.faults.append((at, fault.kind, target))

    def web_to_kill(self) -> str:
        """Both web processes UP (one down at a time is what the cluster promises), and a long poll parked
        on the one answered."""
        assert self.balancer is not None
        wait_for(lambda: all(self.balancer_up(name) for name in self.web_ports), 60, "both web processes UP")
        parked: list[str] = wait_for(self.balancer.parked, 30, "a long poll parked at a web process", 0.2)
        return parked[0]

    def recover(self, fault: Fault) -> None:
        target = self.targets[fault]
        self.supervisor.restart(target)
        if fault.kind == "web_kill":
            wait_for(lambda: self.balancer_up(target), 60, f"{target} to be UP again")

    # ------------------------------------------------------------ the database, for what no API answers

    def query(self, statement: str) -> list[Any] | None:
        from django.conf import settings

        try:
            url = _admin_url(settings.DATABASE_URL, self.database)
            with psycopg.connect(url, connect_timeout=2) as conn:
                return [row[0] for row in conn.execute(statement).fetchall()]  # type: ignore[arg-type]
        except psycopg.Error:
            return None

    def read_back(self) -> None:
        super().read_back()
        twice = self.query(
            "SELECT run_id::text || ' ' || count(*) FROM run_event WHERE kind = 'accepted' "
            "GROUP BY run_id HAVING count(*) > 1"
        )
        assert twice is not None, "the database did not answer"
        self.result.accepted_twice = {line.split()[0]: int(line.split()[1]) for line in twice}
        kinds = self.query("SELECT kind || ' ' || count(*) FROM run_event GROUP BY kind")
        self.result.events = {line.split()[0]: int(line.split()[1]) for line in kinds or []}
        scraper = GantryClient(self.balancer.url, self.metrics_token, timeout=30, retry=PATIENT)
        self.result.sweeps = reaper_sweeps(scraper.request("GET", "/metrics").body.decode())
        assert self.github is not None
        self.result.workflow_runs = len(self.github.runs)

    # ------------------------------------------------------------ the end

    def stop(self) -> None:
        """Stop everything, even after a failed boot (then only what was started), and read the logs."""
        try:
            if self.balancer is not None and "haproxy" in self.supervisor.children:
                with contextlib.suppress(OSError):
                    self.result.stats = self.balancer.stats()
            self.supervisor.stop_all()
            if self.gantry is not None:
                for name in self.token_files:
                    self.gantry.kill_leftover_runners(self.tmp / name)
            for server in (self.github, self.issuer):
                if server is not None:
                    server.close()
            logs = self.tmp / "logs"
            if self.balancer is not None and "haproxy" in self.supervisor.children:
                self.result.requests = self.balancer.requests()
            for name in ("worker-a", "worker-b"):
                with contextlib.suppress(OSError):
                    text = (logs / f"{name}.log").read_text(errors="replace")
                    self.result.beat_ticks[name] = text.count("Scheduler: Sending due task")
            self.out.process_logs = {
                "web": [logs / f"{n}.log" for n in self.web_ports],
                "worker": [logs / "worker-a.log", logs / "worker-b.log"],
                "dispatcher": [logs / "dispatcher-a.log", logs / "dispatcher-b.log"],
                "coordinator": [logs / f"{n}.log" for n in self.token_files],
                "runners": [p for n in self.token_files for p in sorted((self.tmp / n / "logs").glob("*.log"))],
            }
        finally:
            if self.database:
                with psycopg.connect(self.admin_url, autocommit=True) as conn:
                    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.database))
                    conn.execute(drop)


def reaper_sweeps(metrics: str) -> dict[str, float]:
    """Sweeps per reaper, from ``gantry_reaper_sweep_duration_seconds_count{reaper="…"}``."""
    found: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("gantry_reaper_sweep_duration_seconds_count{"):
            labels, value = line.rsplit(" ", 1)
            reaper = labels.split('reaper="', 1)[1].split('"', 1)[0]
            found[reaper] = found.get(reaper, 0.0) + float(value)
    return found


def run_cluster(seed: int, tmp: Path) -> ClusterOutcome:
    cluster = Cluster(seed, tmp)
    try:
        cluster.boot()
        began = time.monotonic()
        cluster.play()
        cluster.drain(timeout=TIMINGS["GANTRY_RUNNER_STARTUP_DEADLINE"] + 60)
        cluster.result.play_seconds = time.monotonic() - began
        cluster.read_back()
    finally:
        cluster.stop()
        kills = [asdict(kill) for kill in cluster.result.kills]
        (tmp / "outcome.json").write_text(json.dumps({"kills": kills, "seconds": cluster.out.seconds}))
    return cluster.result


def polls_cut(result: ClusterOutcome) -> list[tuple[str, str, float | None]]:
    """Per poll parked on a web process when it was killed: (the process, the group's coordinators, seconds).

    ``seconds`` is how long the poll was gone: 0.0 when the balancer sent it
    again to the live process itself (the coordinator never saw the kill),
    else from the kill to the start of the group's next poll (a group's
    coordinators share its token, so the next poll may be a sibling's); None
    when the group never polled again.
    """
    found: list[tuple[str, str, float | None]] = []
    polls = [r for r in result.requests if r.path == POLL_PATH and r.auth_crc in result.coordinator_crcs]
    for kill in result.kills:
        if kill.kind != "web_kill":
            continue
        for crc, coordinator in result.coordinator_crcs.items():
            mine = sorted((r for r in polls if r.auth_crc == crc), key=lambda r: r.start)
            parked = [r for r in mine if r.start < kill.at < r.end and (r.server == kill.target or r.retries)]
            for poll in parked:
                if poll.status < 500 and poll.server != kill.target:
                    found.append((kill.target, coordinator, 0.0))
                    continue
                after = [r.start for r in mine if r.start >= poll.end]
                found.append((kill.target, coordinator, min(after) - kill.at if after else None))
    return found


def cut_by_a_kill(result: ClusterOutcome, request: Request) -> bool:
    """Whether ``request`` was open at a web process when it was killed, and ended there (haproxy logs
    times to the millisecond: 10 ms of slack)."""
    return any(
        kill.kind == "web_kill"
        and request.server == kill.target
        and request.start <= kill.at + 0.01
        and request.end >= kill.at - 0.01
        for kill in result.kills
    )


def in_flight_at_kills(result: ClusterOutcome) -> int:
    """Requests the balancer had open at a killed web process when it died (the most a crash may cost)."""
    return sum(
        1
        for kill in result.kills
        if kill.kind == "web_kill"
        for r in result.requests
        if r.start <= kill.at <= r.end and (r.server == kill.target or r.retries or r.redispatched)
    )


BACKOFF_BOUND = 2 * COORDINATOR_BACKOFF_CAP
