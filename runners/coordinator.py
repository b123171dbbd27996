"""``python -m runners.coordinator``: one runner group's long-lived daemon.

While it has free capacity (``--max-parallel`` workers) it long-polls Gantry
for a run, starts an ephemeral runner for each claim through its launcher, and
reaps workers as they finish. A launch that fails is reported as
``dispatch-failed`` (the run is claimed: only a runner could start it, so the
server fails it rather than leave it to its lease). Server errors and an
unreachable server are backed off exponentially (up to ``--backoff-cap``
seconds), never fatal. On start-up it re-attaches to the workers its launcher
can still find (the local launcher: its state folder; the Docker launcher: its
containers' labels), counting them against its capacity; a launcher that
cannot list them yet (a Docker engine still starting) is asked again, with
backoff, before the first poll.

SIGTERM or SIGINT: stop polling (a parked long poll is cut off), finish the
launch in hand, exit 0. Running workers are left alone: they finish their runs
by themselves, and the next coordinator re-attaches to them. A second signal
exits at once.

Log lines are JSON with a stable ``event``: ``coordinator.started``,
``run.claimed``, ``worker.launched``, ``worker.reattached``, ``worker.exited``,
``launch.retry``, ``dispatch.failed``, ``poll.backoff``, ``discover.failed``, ``coordinator.stopped``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import launchers
from launchers.base import Assignment, Launcher, LaunchError, WorkerHandle
from runners import logsetup
from runners.client import DEFAULT_RETRY, ApiError, Claim, GantryClient, RequestAborted
from runners.logsetup import event

log = logging.getLogger("gantry.coordinator")

EXIT_OK = 0
EXIT_LOCKED = 1
EXIT_USAGE = 2


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


def describe(handle: WorkerHandle) -> str:
    return f"pid {handle.ident}" if handle.kind == "local" else f"{handle.kind} worker {handle.ident}"


class Coordinator:
    def __init__(self, client: GantryClient, launcher: Launcher, settings: Settings | None = None) -> None:
        self.client = client
        self.launcher = launcher
        self.settings = settings or Settings()
        self.workers: dict[str, WorkerHandle] = {}
        # The group this coordinator serves: its launcher labels workers with it and discovers only those.
        self.group_id = client.token_subject
        launcher.group_id = self.group_id
        self.stop_event = threading.Event()
        self._server_failures = 0
        self._launch_failures = 0
        self._signals = 0
        # For tests and metrics: what happened so far.
        self.claimed = 0
        self.launched = 0
        self.dispatch_failures = 0

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
        while not self.stop_event.is_set():
            self.step()
        self.reap()
        event(log, "coordinator.stopped", "stopped; leaving %d worker(s) running", len(self.workers),
              workers=sorted(self.workers))  # fmt: skip
        return EXIT_OK

    def step(self) -> None:
        """One turn: reap, then poll and launch if there is room, else wait for a slot."""
        self.reap()
        if len(self.workers) >= self.settings.max_parallel:
            self.stop_event.wait(1.0)
            return
        started = time.monotonic()
        try:
            claim = self.client.poll(self.settings.wait)
        except RequestAborted:
            return  # stopping
        except ApiError as exc:
            self._back_off(exc)
            return
        self._server_failures = 0
        if claim is None:
            # A long poll that ends empty asks again at once; an instant empty
            # answer (wait=0) would hot-loop, so pause.
            if time.monotonic() - started < self.settings.idle_pause:
                self.stop_event.wait(self.settings.idle_pause)
            return
        self.launch(claim)

    def reattach(self) -> None:
        failures = 0
        while True:
            try:
                found = self.launcher.discover()
                break
            except LaunchError as exc:
                # An engine that does not answer yet (Docker restarting): without
                # its list the capacity is unknown, so wait for it, never poll blind.
                failures += 1
                event(log, "discover.failed", "cannot list the launcher's workers: %s", exc.message,
                      level=logging.WARNING, failures=failures)  # fmt: skip
                self._pause("discover failed", failures, exc.message, status=None)
                if self.stop_event.is_set():
                    return
        for handle in found:
            self.workers[handle.run_id] = handle
            event(log, "worker.reattached", "re-attached to %s for run %s", describe(handle), handle.run_id,
                  run_id=handle.run_id, runner_id=handle.runner_id, worker=handle.ident)  # fmt: skip

    def reap(self) -> None:
        for run_id, handle in list(self.workers.items()):
            if self.launcher.is_alive(handle):
                failure = self.launcher.startup_failure(handle)
                if failure is None:
                    continue
                # Launched, but it will never start its runner (an image that
                # does not pull): stop it and fail the run as a dispatch failure.
                self.launcher.terminate(handle, grace=0)
                self.launcher.reap(handle)
                del self.workers[run_id]
                self._dispatch_failed(Claim(run_id=run_id, runner_id=handle.runner_id, runner_token="",
                                            assigned_expires_at=""), failure)  # fmt: skip
                continue
            code = self.launcher.reap(handle)
            del self.workers[run_id]
            event(log, "worker.exited", "worker for run %s exited with code %s", run_id,
                  "unknown" if code is None else code, run_id=run_id, worker=handle.ident,
                  exit_code=code, seconds=round(time.time() - handle.started_at, 3))  # fmt: skip

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
        attempt = 0
        while True:
            attempt += 1
            try:
                handle = self.launcher.launch(assignment)
                break
            except LaunchError as exc:
                error = exc
            except Exception as exc:  # a launcher bug must not strand a claimed run or kill the daemon
                log.exception("launcher error", extra={"event": "launch.crashed", "run_id": claim.run_id})
                error = LaunchError(f"{type(exc).__name__}: {exc}", permanent=True)
            if error.permanent or attempt >= self.settings.launch_attempts:
                self._dispatch_failed(claim, error)
                return
            event(log, "launch.retry", "launch of run %s failed (transient), retrying: %s", claim.run_id,
                  error.message, level=logging.WARNING, run_id=claim.run_id, attempt=attempt)  # fmt: skip
            # Not interrupted by a stop: the run is claimed and this is the step in hand.
            time.sleep(self.settings.launch_retry_delay * attempt)
        self.launched += 1
        self._launch_failures = 0
        self.workers[claim.run_id] = handle
        event(log, "worker.launched", "launched %s for run %s", describe(handle), claim.run_id,
              run_id=claim.run_id, runner_id=claim.runner_id, worker=handle.ident)  # fmt: skip

    def _dispatch_failed(self, claim: Claim, error: LaunchError) -> None:
        self.dispatch_failures += 1
        self._launch_failures += 1
        event(log, "dispatch.failed", "dispatch failed for run %s: %s", claim.run_id, error.message,
              level=logging.ERROR, run_id=claim.run_id, runner_id=claim.runner_id,
              permanent=error.permanent)  # fmt: skip
        try:
            self.client.dispatch_failed(run_id=claim.run_id, runner_id=claim.runner_id, error=error.message)
        except ApiError as exc:
            # The run stays assigned until its lease lapses, then returns to pending.
            event(log, "dispatch.report_failed", "could not report the failed dispatch of run %s: %s",
                  claim.run_id, exc, level=logging.ERROR, run_id=claim.run_id)  # fmt: skip
        # A launcher that cannot launch would fail every run it claims: slow down
        # rather than burn through the queue.
        self._pause("launch failures", self._launch_failures, error.message, status=None)

    def _back_off(self, exc: ApiError) -> None:
        self._server_failures += 1
        if exc.status == 401:
            event(log, "poll.unauthorized", "the group token was refused (rotated or revoked?): %s", exc.detail,
                  level=logging.ERROR)  # fmt: skip
        self._pause("poll failed", self._server_failures, str(exc), status=exc.status)

    def _pause(self, why: str, failures: int, error: str, *, status: int | None) -> None:
        ceiling = min(self.settings.backoff_cap, self.settings.backoff_base * 2 ** (failures - 1))
        delay = ceiling / 2 + random.uniform(0, ceiling / 2)  # jittered, never near zero
        event(log, "poll.backoff", "%s (%s); backing off %.1fs", why, error, delay, level=logging.WARNING,
              seconds=round(delay, 3), failures=failures, status=status)  # fmt: skip
        self.stop_event.wait(delay)


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
    parser = argparse.ArgumentParser(
        prog="python -m runners.coordinator",
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
        default=int(env.get("GANTRY_MAX_PARALLEL") or 4),
        help="workers at once [GANTRY_MAX_PARALLEL; default 4]",
    )
    parser.add_argument(
        "--state-dir",
        default=env.get("GANTRY_STATE_DIR") or str(default_state_dir()),
        help="the launcher's state folder [GANTRY_STATE_DIR; default $XDG_STATE_HOME/gantry/coordinator]",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=float(env.get("GANTRY_POLL_WAIT") or 30),
        help="long-poll wait, 0-30 s [GANTRY_POLL_WAIT; default 30]",
    )
    parser.add_argument("--backoff-cap", type=float, default=30.0, help="longest pause after errors (default 30 s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout on top of the poll's wait")
    parser.add_argument("--log-level", default=env.get("GANTRY_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    token = args.token or env.get("GANTRY_GROUP_TOKEN")
    if not token and args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            parser.error(f"--token-file: {exc}")
    if not args.server:
        parser.error("--server (or GANTRY_SERVER) is required")
    if not token:
        parser.error("a group token is required: GANTRY_GROUP_TOKEN, --token-file or --token")
    if args.max_parallel < 1:
        parser.error("--max-parallel must be at least 1")
    if not 0 <= args.wait <= 30:
        parser.error("--wait must be from 0 to 30 seconds")
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
        client = GantryClient(args.server, args.token, timeout=args.timeout, retry=DEFAULT_RETRY)
        settings = Settings(max_parallel=args.max_parallel, wait=args.wait, backoff_cap=args.backoff_cap)
        coordinator = Coordinator(client, launcher, settings)
        coordinator.install_signal_handlers()
        event(log, "coordinator.started", "coordinator for %s: launcher %s, up to %d workers, state %s",
              args.server, args.launcher, args.max_parallel, state_dir, server=args.server, launcher=args.launcher,
              max_parallel=args.max_parallel, state_dir=str(state_dir), pid=os.getpid())  # fmt: skip
        return coordinator.run()


if __name__ == "__main__":
    sys.exit(main())
