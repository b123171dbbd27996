"""``python -m runners.coordinator``: one runner group's long-lived daemon.

While it has free capacity (``--max-parallel`` workers) it long-polls Gantry
for a run and starts an ephemeral runner for each claim through its launcher.
A launch that fails is reported as ``dispatch-failed`` (the run is claimed:
only a runner could start it, so the server fails it rather than leave it to
its lease). On start-up it re-attaches to the workers its launcher can still
find (the local launcher: its state folder; the Docker and Kubernetes
launchers: their workers' labels), counting them against its capacity; a
launcher that cannot list them yet (a Docker engine still starting) is asked
again, with backoff, before the first poll.

Beside the poll loop, on a thread and HTTP connection of its own, the
reconciler (``runners.reconcile``) keeps Gantry and the launcher in step:
every ``--reconcile-interval`` seconds, and at once when a worker exits, it
reaps the finished workers, reports them all (``POST
/runner-groups/reconcile``: a worker that died under its run fails that run
at once) and stops, through the launcher's ``terminate``, the workers whose
run no longer needs them. Every loop (the poll, launches, the report) backs
off failures with one policy (``runners.client.Backoff``, up to
``--backoff-cap`` seconds); none is fatal.

With ``--warm N`` (``runners.warm``) it keeps N runners started and waiting
for a claim, beside its busy workers: a claim goes to a warm runner when one
waits (else it is launched cold), and the reconciler's turns replace the warm
runners that were handed a claim or died.

SIGTERM or SIGINT: stop polling (a parked long poll is cut off), finish the
launch in hand, stop the warm runners (they hold nothing), take a last
reconcile turn, exit 0. Running workers are left alone: they finish their runs
by themselves, and the next coordinator re-attaches to them. A second signal
exits at once.

Before the first poll, one call with the token (``check_server``) tells a
refused token or a URL that is not Gantry (exit 3) from a server that is not
up yet (waited for). Usage errors exit 2 with one line (docs/runners.md,
"Exit codes"). ``--health-addr`` serves ``/healthz`` and ``/metrics``
(``runners.health``).

Log lines are JSON with a stable ``event``: ``coordinator.started``,
``run.claimed``, ``worker.launched``, ``worker.reattached``, ``worker.exited``,
``worker.stopping``, ``warm.started``, ``warm.exited``, ``warm.start_failed``,
``warm.stopped``, ``warm.zygote_started``, ``warm.zygote_exited``,
``launch.retry``, ``dispatch.failed``, ``poll.backoff``,
``poll.unauthorized``, ``reconcile.backoff``, ``discover.failed``,
``coordinator.token_malformed``, ``coordinator.refused``, ``coordinator.stopped``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import launchers
from gantry_wire import logsetup
from gantry_wire.logsetup import event
from gantry_wire.protocol import (
    COORDINATOR_HEADER_MAX,
    COORDINATOR_HOST_HEADER,
    COORDINATOR_ID_HEADER,
    COORDINATOR_VERSION_HEADER,
    VERSION,
)
from launchers.base import Assignment, Launcher, LaunchError, WorkerHandle
from runners.cli import OneLineParser, check_range, env_number
from runners.client import (
    DEFAULT_RETRY,
    ApiError,
    Backoff,
    Claim,
    GantryClient,
    RequestAborted,
    RetryPolicy,
    group_token_problem,
)
from runners.health import CoordinatorMetrics, HealthServer, Verdict, judge, parse_addr
from runners.reconcile import Fleet, Reconciler, describe
from runners.warm import WarmPool

log = logging.getLogger("gantry.coordinator")

EXIT_OK = 0
EXIT_LOCKED = 1
EXIT_USAGE = 2
# The token is malformed or refused, or the URL is not a Gantry server: trying again cannot help.
EXIT_REFUSED = 3

PROG = "python -m runners.coordinator"


@dataclass
class Settings:
    max_parallel: int = 4
    wait: float = 30.0
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    # Transient launch failures are retried this many times (within the lease) before dispatch-failed.
    launch_attempts: int = 3
    launch_retry_delay: float = 1.0
    # With wait=0 (or an instant 204), the pause before polling again.
    idle_pause: float = 1.0
    # How often the reconciler reports the workers (and stops the needless ones).
    reconcile_interval: float = 5.0
    # The runners' own grace (GANTRY_STOP_GRACE): a stopped worker gets this long, and a margin, before SIGKILL.
    stop_grace: float = 10.0
    # Warm runners kept waiting for a claim (--warm); not counted in max_parallel, at most that many.
    warm: int = 0

    def backoff(self) -> RetryPolicy:
        """The one policy every loop backs off with: doubling from ``backoff_base`` up to ``backoff_cap``."""
        return RetryPolicy(attempts=sys.maxsize, base=self.backoff_base, cap=self.backoff_cap, floor=0.5)

    def launch_retry(self) -> RetryPolicy:
        """The same policy, for a transient launch failure's retries (from ``launch_retry_delay``)."""
        return RetryPolicy(attempts=self.launch_attempts, base=self.launch_retry_delay, cap=self.backoff_cap, floor=0.5)


def identity_headers(instance_id: str, host: str | None = None) -> dict[str, str]:
    """The poll's identity headers: this process's id, its host name and version (docs/protocol.md).

    The host name is cut to what the server accepts (visible ASCII, no spaces,
    at most COORDINATOR_HEADER_MAX), so an odd host name never costs the poll a 400.
    """
    name = "".join(c for c in (socket.gethostname() if host is None else host) if "!" <= c <= "~")
    headers = {COORDINATOR_ID_HEADER: instance_id, COORDINATOR_VERSION_HEADER: VERSION}
    if name:
        headers[COORDINATOR_HOST_HEADER] = name[: COORDINATOR_HEADER_MAX[COORDINATOR_HOST_HEADER]]
    return headers


class Coordinator:
    def __init__(
        self,
        client: GantryClient,
        launcher: Launcher,
        settings: Settings | None = None,
        *,
        reconcile_client: GantryClient | None = None,
    ) -> None:
        self.client = client
        self.launcher = launcher
        self.settings = settings or Settings()
        self.fleet = Fleet()
        # The group this coordinator serves: its launcher labels workers with it and discovers only those.
        self.group_id = client.token_subject
        launcher.group_id = self.group_id
        # Who polls, as the group's page shows it: one id per coordinator process.
        self.instance_id = uuid.uuid4().hex
        client.poll_headers = identity_headers(self.instance_id)
        self.stop_event = threading.Event()
        self._poll_backoff = Backoff(self.settings.backoff())
        self._launch_backoff = Backoff(self.settings.backoff())
        # After failed launches, no poll before this (monotonic): a launcher
        # that cannot launch would fail every run it claims.
        self._hold_until = 0.0
        self._signals = 0
        self.warm = WarmPool(launcher, self.settings.warm, self.settings.backoff()) if self.settings.warm else None
        # Its own client, so its own HTTP connections: a parked long poll never delays a report.
        self.reconciler = Reconciler(
            client=reconcile_client or GantryClient(client.server, client.token, timeout=client.timeout),
            launcher=launcher,
            fleet=self.fleet,
            interval=self.settings.reconcile_interval,
            backoff=self.settings.backoff(),
            stop_grace=self.settings.stop_grace,
            dispatch_failed=self._startup_failed,
            warm=self.warm,
        )
        # For tests and metrics: what happened so far.
        self.claimed = 0
        self.launched = 0
        self.dispatch_failures = 0
        self.metrics = CoordinatorMetrics(launcher.kind or type(launcher).__name__)
        self.started_at = time.time()
        # The poll loop's heartbeat (monotonic), taken at every turn; a launch in hand may take
        # as long as its launcher needs (an image pull), so it is not held against the loop.
        self._poll_beat = time.monotonic()
        self._launching = False

    @property
    def workers(self) -> dict[str, WorkerHandle]:
        """The workers by run id, as of now (a copy)."""
        return self.fleet.snapshot()

    # ------------------------------------------------------------ control

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            raise SystemExit(128 + signum)
        self.stop()

    def stop(self) -> None:
        """Stop after the step in hand; cut off a parked long poll. Safe from a signal handler."""
        self.stop_event.set()
        self.client.abort()

    # ------------------------------------------------------------ the loop

    def run(self) -> int:
        self.reattach()
        self.reconciler.start()
        while not self.stop_event.is_set():
            self.poll_turn()
        if self.warm is not None:
            stopped = self.warm.close()
            event(log, "warm.stopped", "stopped %d warm runner(s)", stopped, count=stopped)
        self.reconciler.stop()
        event(log, "coordinator.stopped", "stopped; leaving %d worker(s) running", len(self.fleet),
              workers=sorted(self.workers))  # fmt: skip
        return EXIT_OK

    def step(self) -> None:
        """One turn of both loops, in this thread (tests drive the coordinator this way): reconcile, then poll."""
        self.reconciler.turn()
        self.poll_turn()

    def poll_turn(self) -> None:
        """Poll and launch if there is room, else wait for a slot."""
        self._poll_beat = time.monotonic()
        if len(self.fleet) >= self.settings.max_parallel:
            self.fleet.wait_for_room(self.settings.max_parallel, timeout=1.0)
            return
        held = self._hold_until - time.monotonic()
        if held > 0:
            self.stop_event.wait(held)
            return
        started = time.monotonic()
        try:
            claim = self.client.poll(self.settings.wait)
        except RequestAborted:
            return  # stopping
        except ApiError as exc:
            self.metrics.polled("unauthorized" if exc.status == 401 else "error")
            self._poll_failed(exc)
            return
        self._poll_backoff.succeeded()
        self.metrics.polled("empty" if claim is None else "assigned")
        if claim is None:
            # A long poll that ends empty asks again at once; an instant empty
            # answer (wait=0) would hot-loop, so pause.
            if time.monotonic() - started < self.settings.idle_pause:
                self.stop_event.wait(self.settings.idle_pause)
            return
        self.launch(claim)

    def reattach(self) -> None:
        backoff = Backoff(self.settings.backoff())
        while True:
            self._poll_beat = time.monotonic()
            try:
                found = self.launcher.discover()
                break
            except LaunchError as exc:
                # An engine that does not answer yet (Docker restarting): without
                # its list the capacity is unknown, so wait for it, never poll blind.
                delay = backoff.failed()
                event(log, "discover.failed", "cannot list the launcher's workers: %s", exc.message,
                      level=logging.WARNING, failures=backoff.failures)  # fmt: skip
                self._log_backoff("discover failed", delay, backoff.failures, exc.message, status=None)
                if self.stop_event.wait(delay):
                    return
        for handle in found:
            self.fleet.add(handle)
            event(log, "worker.reattached", "re-attached to %s for run %s", describe(handle), handle.run_id,
                  run_id=handle.run_id, runner_id=handle.runner_id, worker=handle.ident)  # fmt: skip
        # Those that ended while no coordinator watched: their runs are told now, not after the reaper's hour.
        for unseen in self.launcher.take_unseen_exits():
            self.reconciler.add_exit(unseen.handle, unseen.exit_code, unseen.last_lines, None)

    def launch(self, claim: Claim) -> None:
        self.claimed += 1
        event(log, "run.claimed", "claimed run %s", claim.run_id, run_id=claim.run_id, runner_id=claim.runner_id,
              assigned_expires_at=claim.assigned_expires_at)  # fmt: skip
        assignment = Assignment(
            server=self.client.server,
            run_id=claim.run_id,
            runner_id=claim.runner_id,
            runner_token=claim.runner_token,
            assigned_expires_at=claim.assigned_expires_at,
            group_id=self.group_id,
        )
        self._launching = True
        try:
            handle = self.warm.take(assignment) if self.warm is not None else None
            warm = handle is not None
            if handle is None:
                handle = self._launch_cold(claim, assignment)
            else:
                self.reconciler.wake()  # a warm runner was used: the reconciler starts its replacement
        finally:
            self._launching = False
            self._poll_beat = time.monotonic()
        if handle is None:
            return  # dispatch-failed
        self.launched += 1
        self.metrics.launched()
        self._launch_backoff.succeeded()
        self.fleet.add(handle)
        event(log, "worker.launched", "launched %s for run %s%s", describe(handle), claim.run_id,
              " (warm)" if warm else "", run_id=claim.run_id, runner_id=claim.runner_id, worker=handle.ident,
              warm=warm)  # fmt: skip

    def _launch_cold(self, claim: Claim, assignment: Assignment) -> WorkerHandle | None:
        """Start a runner for the claim, retrying transient failures; None once it was reported dispatch-failed."""
        retry = self.settings.launch_retry()
        attempt = 0
        while True:
            attempt += 1
            reason = "permanent"
            try:
                return self.launcher.launch(assignment)
            except LaunchError as exc:
                error = exc
            except Exception as exc:  # a launcher bug must not strand a claimed run or kill the daemon
                log.exception("launcher error", extra={"event": "launch.crashed", "run_id": claim.run_id})
                error = LaunchError(f"{type(exc).__name__}: {exc}", permanent=True)
                reason = "launcher_error"
            if error.permanent or attempt >= retry.attempts:
                self._dispatch_failed(claim.run_id, claim.runner_id, error,
                                      reason=reason if error.permanent else "retries_exhausted")  # fmt: skip
                return None
            event(log, "launch.retry", "launch of run %s failed (transient), retrying: %s", claim.run_id,
                  error.message, level=logging.WARNING, run_id=claim.run_id, attempt=attempt)  # fmt: skip
            # Not interrupted by a stop: the run is claimed and this is the step in hand.
            time.sleep(retry.delay(attempt))

    def _startup_failed(self, handle: WorkerHandle, error: LaunchError) -> None:
        self._dispatch_failed(handle.run_id, handle.runner_id, error, reason="startup")

    def _dispatch_failed(self, run_id: str, runner_id: str, error: LaunchError, *, reason: str) -> None:
        self.dispatch_failures += 1
        self.metrics.launch_failed(reason)
        event(log, "dispatch.failed", "dispatch failed for run %s: %s", run_id, error.message,
              level=logging.ERROR, run_id=run_id, runner_id=runner_id, permanent=error.permanent)  # fmt: skip
        try:
            self.client.dispatch_failed(run_id=run_id, runner_id=runner_id, error=error.message)
        except ApiError as exc:
            # The run stays assigned until its lease lapses, then returns to pending.
            event(log, "dispatch.report_failed", "could not report the failed dispatch of run %s: %s",
                  run_id, exc, level=logging.ERROR, run_id=run_id)  # fmt: skip
        # A launcher that cannot launch would fail every run it claims: hold
        # the next poll back rather than burn through the queue.
        delay = self._launch_backoff.failed()
        self._hold_until = time.monotonic() + delay
        self._log_backoff("launch failures", delay, self._launch_backoff.failures, error.message, status=None)

    def _poll_failed(self, exc: ApiError) -> None:
        if exc.status == 401:
            # Still retried: an operator may be about to fix it (a key rotated in on the
            # servers one by one), and a coordinator that exits would restart into the same.
            event(log, "poll.unauthorized", "%s", refusal(exc), level=logging.ERROR, code=exc.code)
        delay = self._poll_backoff.failed()
        self._log_backoff("poll failed", delay, self._poll_backoff.failures, str(exc), status=exc.status)
        self.stop_event.wait(delay)

    # ------------------------------------------------------------ start-up check

    def check_server(self) -> str | None:
        """One call with the token before the first poll: None when Gantry accepted it (or a signal
        stopped the wait), else why this coordinator cannot work (the token refused, not a Gantry server).

        A server that cannot be reached or answers 5xx is waited for, with the
        loops' backoff: in Kubernetes or Compose the coordinator often starts
        before the server does.
        """
        backoff = Backoff(self.settings.backoff())
        while not self.stop_event.is_set():
            self._poll_beat = time.monotonic()  # this thread's loop, before the polls
            try:
                resp = self.client.group_demand()
            except RequestAborted:
                return None
            except ApiError as exc:
                if exc.transient:
                    delay = backoff.failed()
                    self._log_backoff("server check failed", delay, backoff.failures, str(exc), status=exc.status)
                    self.stop_event.wait(delay)
                    continue
                if exc.status in (401, 403) and isinstance(exc.body, dict):
                    return refusal(exc)
                return not_gantry(self.client.server, exc.status, exc.detail)
            body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else None
            if resp.status == 200 and isinstance(body, dict) and {"runnable", "running"} <= body.keys():
                return None
            location = resp.headers.get("location")
            # Redirects are not followed: a token is never sent on to wherever they point.
            why = f"redirected to {location}" if location else "the answer is not Gantry's"
            return not_gantry(self.client.server, resp.status, why)
        return None

    # ------------------------------------------------------------ health

    def stale_after(self) -> float:
        """Seconds without a successful answer from Gantry after which ``/healthz`` says 503.

        The longest a healthy coordinator goes without one: a long poll and its
        timeout (twice: an answer lost at the end of one), the reconciler's
        period and a timeout (while at capacity, no poll is sent), or three
        backoff pauses at their cap (a server restarting).
        """
        s, timeout = self.settings, self.client.timeout
        return max(3 * s.backoff_cap, 2 * s.wait + timeout, 2 * s.reconcile_interval + timeout)

    def verdict(self) -> Verdict:
        """What ``/healthz`` answers (runners.health.judge): the loops alive, the last answer recent."""
        bound = self.stale_after()
        poll_alive = self._launching or time.monotonic() - self._poll_beat <= bound
        contacts = [t for t in (self.client.last_success, self.reconciler.client.last_success) if t is not None]
        return judge(
            loops={"poll": poll_alive, "reconcile": self.reconciler.alive},
            last_contact=max(contacts, default=None),
            started=self.started_at,
            stale_after=bound,
        )

    def metrics_text(self) -> str:
        contacts = [t for t in (self.client.last_success, self.reconciler.client.last_success) if t is not None]
        warm = 0 if self.warm is None else len(self.warm)
        return self.metrics.exposition(workers=len(self.fleet), warm=warm, last_contact=max(contacts, default=None))

    def _log_backoff(self, why: str, delay: float, failures: int, error: str, *, status: int | None) -> None:
        event(log, "poll.backoff", "%s (%s); backing off %.1fs", why, error, delay, level=logging.WARNING,
              seconds=round(delay, 3), failures=failures, status=status)  # fmt: skip


def refusal(exc: ApiError) -> str:
    """Which refusal a 401 or 403 is, from the server's error: a token it cannot verify, or one it no longer honours.

    The shape of the token was checked at start (``group_token_problem``), so a
    token the server cannot verify was signed elsewhere (another Gantry, a
    retired key) or has expired; one it verifies but refuses was revoked.
    """
    if exc.status == 403:
        return f"the server takes this token but not as a runner group's ({exc.code}: {exc.detail})"
    if exc.detail.startswith("invalid token") or "audience" in exc.detail:
        return (
            "the server cannot verify the group token (malformed for it, signed by another Gantry or with a "
            f"retired key, or expired): {exc.detail}"
        )
    return f"the server refused the group token: revoked (the group's token was rotated) or unknown: {exc.detail}"


def not_gantry(server: str, status: int, detail: str) -> str:
    return (
        f"{server} does not answer as a Gantry server (GET /api/v1/runner-groups/demand: {status}, "
        f"{detail[:120]!r}); --server is Gantry's root URL, as in the browser"
    )


def server_url_problem(value: str) -> str | None:
    """Why ``value`` cannot be Gantry's root URL (``--server``), or None."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https"):
        return f"--server must be an http:// or https:// URL (Gantry's root, as in the browser), not {value!r}"
    if not parts.hostname:
        return f"--server names no host: {value!r}"
    try:
        parts.port  # noqa: B018 (a malformed port raises)
    except ValueError:
        return f"--server has a malformed port: {value!r}"
    if re.search(r"(^|/)api(/|$)", parts.path):
        return f"--server is Gantry's root URL, without /api/v1: {parts.scheme}://{parts.netloc}{parts.path.split('/api')[0]}"
    if parts.query or parts.fragment:
        return f"--server takes no query or fragment: {value!r}"
    return None


# ---------------------------------------------------------------- CLI


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[bool]:
    """Hold an exclusive lock on the state folder: two coordinators must never share one."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(state_dir / "coordinator.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield True


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gantry" / "coordinator"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = OneLineParser(
        prog=PROG,
        description="Long-poll Gantry for a runner group's runs and start an ephemeral runner for each. "
        "Every flag has an environment variable; prefer GANTRY_GROUP_TOKEN (or --token-file) over --token, "
        "which any user on the host can read with ps.",
    )
    parser.add_argument("--server", default=env.get("GANTRY_SERVER"), help="service root URL [GANTRY_SERVER]")
    parser.add_argument("--token", default=None, help="the runner group's token [GANTRY_GROUP_TOKEN]")
    parser.add_argument("--token-file", default=env.get("GANTRY_GROUP_TOKEN_FILE"), help="read the token from a file")
    parser.add_argument(
        "--launcher", default=env.get("GANTRY_LAUNCHER", "local"), help="launcher kind: local, docker, kubernetes"
    )
    parser.add_argument(
        "--launcher-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option for the launcher (repeatable, each KEY once; list values are comma-separated; "
        "docs/launchers.md). "
        "local: python=PATH, work_dir=DIR, pass_env=NAME,NAME. "
        "docker: image=IMAGE (required), network=NAME|host, server_url=URL, pull=never|missing|always, "
        "cpus=N, memory=SIZE, env=NAME,NAME, volume=SRC:DST[:ro],..., keep=true|false. "
        "kubernetes: image=IMAGE (required), namespace=NS, context=NAME, service_account=NAME, "
        "cpu_request/cpu_limit/memory_request/memory_limit=QUANTITY, node_selector=K=V,K2=V2, "
        "image_pull_policy=Always|IfNotPresent|Never, active_deadline_seconds=N, server_url=URL, "
        "startup_grace=SECONDS (30), pod_template=FILE.yaml",
    )
    parser.add_argument(
        "--max-parallel",
        type=int,
        default=env_number(parser, "GANTRY_MAX_PARALLEL", int, 4),
        help="workers at once [GANTRY_MAX_PARALLEL; default 4]",
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=env_number(parser, "GANTRY_WARM", int, 0),
        help="runners kept started and waiting for a claim, 0 to --max-parallel (the local launcher); "
        "--max-parallel counts busy workers only [GANTRY_WARM; default 0]",
    )
    parser.add_argument(
        "--state-dir",
        default=env.get("GANTRY_STATE_DIR") or str(default_state_dir()),
        help="the launcher's state folder [GANTRY_STATE_DIR; default $XDG_STATE_HOME/gantry/coordinator]",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=env_number(parser, "GANTRY_POLL_WAIT", float, 30.0),
        help="long-poll wait, 0-30 s [GANTRY_POLL_WAIT; default 30]",
    )
    parser.add_argument(
        "--reconcile-interval",
        type=float,
        default=env_number(parser, "GANTRY_RECONCILE_INTERVAL", float, 5.0),
        help="seconds between reports of the workers to Gantry, 0.1-300 [GANTRY_RECONCILE_INTERVAL; default 5]",
    )
    parser.add_argument("--backoff-cap", type=float, default=30.0, help="longest pause after errors (default 30 s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout on top of the poll's wait")
    parser.add_argument(
        "--health-addr",
        default=env.get("GANTRY_COORDINATOR_HEALTH_ADDR") or None,
        metavar="HOST:PORT",
        help="serve GET /healthz and GET /metrics there (0.0.0.0:8081 in a pod) [GANTRY_COORDINATOR_HEALTH_ADDR; "
        "default off]",
    )
    parser.add_argument("--log-level", default=env.get("GANTRY_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    # Not a flag: the runners this coordinator starts inherit the variable and
    # stop their steps with it; a stopped worker gets that long (and a margin).
    args.stop_grace = env_number(parser, "GANTRY_STOP_GRACE", float, 10.0)
    check_range(parser, args.stop_grace, "GANTRY_STOP_GRACE", 0, None)
    token = args.token or env.get("GANTRY_GROUP_TOKEN")
    if not token and args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            parser.error(f"--token-file: {exc}")
    if not args.server:
        parser.error("--server (or GANTRY_SERVER) is required")
    problem = server_url_problem(args.server)
    if problem:
        parser.error(problem)
    if args.launcher not in launchers.kinds():
        known = ", ".join(launchers.kinds())
        parser.error(f"--launcher (GANTRY_LAUNCHER) must be one of {known}, not {args.launcher!r}")
    if args.health_addr is not None:
        try:
            args.health_addr = parse_addr(args.health_addr)
        except ValueError as exc:
            parser.error(str(exc))
    if not token:
        parser.error("a group token is required: GANTRY_GROUP_TOKEN, --token-file or --token")
    check_range(parser, args.max_parallel, "--max-parallel (GANTRY_MAX_PARALLEL)", 1, None)
    # Bounded: each warm runner is a process (a container) held idle; more than can ever be busy at once is waste.
    check_range(parser, args.warm, "--warm (GANTRY_WARM)", 0, args.max_parallel)
    if args.warm and not launchers.get(args.launcher).supports_warm:
        parser.error(f"--warm (GANTRY_WARM): the {args.launcher} launcher keeps no warm runners (local and docker do)")
    check_range(parser, args.wait, "--wait (GANTRY_POLL_WAIT)", 0, 30)
    check_range(parser, args.reconcile_interval, "--reconcile-interval (GANTRY_RECONCILE_INTERVAL)", 0.1, 300)
    check_range(parser, args.backoff_cap, "--backoff-cap", 0.01, None)
    check_range(parser, args.timeout, "--timeout", 0.1, None)
    options: dict[str, str] = {}
    for item in args.launcher_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--launcher-option takes KEY=VALUE, not {item!r}")
        if key in options:
            # A later value silently replacing an earlier one would drop a volume or a name.
            parser.error(f"--launcher-option {key} is given twice; give a list as one comma-separated value")
        options[key] = value
    args.token = token
    args.options = options
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logsetup.configure(args.log_level)
    # Nothing this process starts may inherit the group's credential.
    os.environ.pop("GANTRY_GROUP_TOKEN", None)
    state_dir = Path(args.state_dir).expanduser().resolve()
    with state_lock(state_dir) as locked:
        if not locked:
            event(log, "coordinator.locked", "another coordinator holds %s", state_dir, level=logging.ERROR)
            return EXIT_LOCKED
        try:
            launcher = launchers.create(args.launcher, state_dir=state_dir, options=args.options)
        except ValueError as exc:
            event(log, "coordinator.bad_launcher", "%s", exc, level=logging.ERROR)
            return EXIT_USAGE
        # Checked here, after the options (a usage error is 2 whatever the token), before any request.
        problem = group_token_problem(args.token)
        if problem:
            event(log, "coordinator.token_malformed", "the group token is malformed: %s", problem, level=logging.ERROR)
            return EXIT_REFUSED
        client = GantryClient(args.server, args.token, timeout=args.timeout, retry=DEFAULT_RETRY)
        settings = Settings(
            max_parallel=args.max_parallel,
            wait=args.wait,
            backoff_cap=args.backoff_cap,
            reconcile_interval=args.reconcile_interval,
            stop_grace=args.stop_grace,
            warm=args.warm,
        )
        coordinator = Coordinator(client, launcher, settings)
        coordinator.install_signal_handlers()
        health = None
        if args.health_addr is not None:
            try:
                health = HealthServer(args.health_addr, coordinator.verdict, coordinator.metrics_text)
            except OSError as exc:
                event(log, "coordinator.bad_health_addr", "--health-addr %s:%d: %s", *args.health_addr,
                      exc.strerror or exc, level=logging.ERROR)  # fmt: skip
                return EXIT_USAGE
            health.start()
        try:
            event(log, "coordinator.started", "coordinator for %s: launcher %s, up to %d workers, state %s",
                  args.server, args.launcher, args.max_parallel, state_dir, server=args.server,
                  launcher=args.launcher, max_parallel=args.max_parallel, warm=args.warm, state_dir=str(state_dir),
                  pid=os.getpid(),
                  reconcile_interval=args.reconcile_interval,
                  health_addr=None if health is None else f"{health.address[0]}:{health.address[1]}")  # fmt: skip
            refused = coordinator.check_server()
            if refused:
                event(log, "coordinator.refused", "%s", refused, level=logging.ERROR)
                return EXIT_REFUSED
            if coordinator.stop_event.is_set():  # stopped while it waited for its server
                event(log, "coordinator.stopped", "stopped before the server answered", workers=[])
                return EXIT_OK
            return coordinator.run()
        finally:
            if health is not None:
                health.stop()


if __name__ == "__main__":
    sys.exit(main())
