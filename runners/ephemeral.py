"""``python -m runners.ephemeral``: run one Gantry run, then go away.

A launcher starts one of these per claimed run, with the server URL, the
runner id, the run id and the runner token (in the environment: tokens never
go on a command line, where ``ps`` shows them). In a GitHub Actions workflow
run (github_actions groups) there is no runner token to hand over: the runner
takes a GitHub OIDC token (``GANTRY_OIDC_TOKEN``, or asks the job for one for
``GANTRY_OIDC_AUDIENCE``) and exchanges it at Gantry for its runner token
first. It then:

1. ``ready`` (idempotent; retried for up to 30 s);
2. ``accept`` → the RunContext (a 409 ``run_already_terminal`` is benign:
   deregister and exit 0; any other refusal: deregister and exit 1);
3. runs each step as ``bash -c <run>`` in its own process group, in a fresh
   work folder, with the spec's env, the stack's secrets and the run's API
   token; stdout and stderr go, merged, into the run's log, which is shipped
   as sealed gzip chunks plus a live snapshot every ``live_interval_s``;
   alongside, a status poll every ``status_interval_s`` keeps the runner
   alive on the server and notices cancellation;
4. seals and uploads the rest of the log, reports ``done`` with the chunk
   manifest, and deregisters.

Exit codes (docs/runners.md): 0 the run succeeded, was cancelled, or was
already over when this runner arrived; 1 the run failed (a step failed or
timed out, the run was refused or lost); 2 the server refused this runner's
credentials or configuration; 3 the server could not be reached; 4 an
internal error of the runner.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from gantry_wire import logsetup
from gantry_wire.logsetup import event
from gantry_wire.protocol import STEP_INHERITED_ENV, TERMINAL_STATUSES
from gantry_wire.record import Frozen, Record
from runners.cli import check_range, env_number
from runners.client import ApiError, GantryClient, RetryPolicy, ServerUnreachable, fetch_actions_oidc_token

# Start-up (docs/runners.md): what only runs after ``ready`` (the step supervisor, the log buffer and
# shipper, masking, shutil, tempfile, signal) is imported where it is used, so a launcher's runner reaches
# ``ready`` having loaded little more than the client; tests/runners/test_import_budget.py keeps it so.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import FrameType
    from typing import Any

    from runners.logbuf import LogBuffer, LogShipper, Manifest
    from runners.steps import StepLog

log = logging.getLogger("gantry.runner")

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_REFUSED = 2
EXIT_UNREACHABLE = 3
EXIT_INTERNAL = 4
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# done is the run's result: worth insisting on for a while before giving up.
DONE_RETRY = RetryPolicy(attempts=1000, base=1.0, cap=30.0, deadline=600.0)
DEREGISTER_RETRY = RetryPolicy(attempts=6, base=0.5, cap=5.0, deadline=30.0)
# What lets a process obtain a runner token by OIDC exchange: never passed on to a step.
CREDENTIAL_ENV = (
    "GANTRY_OIDC_TOKEN", "GANTRY_OIDC_TOKEN_FILE", "ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
)  # fmt: skip


class Config(Record):
    __slots__ = (
        "exit_file", "grace", "keep_work_dir", "launcher", "oidc", "run_id", "runner_id", "server", "timeout",
        "token", "work_dir",
    )  # fmt: skip
    server: str
    runner_id: str
    run_id: str
    token: str
    work_dir: Path
    launcher: str
    grace: float
    keep_work_dir: bool
    exit_file: Path | None
    timeout: float
    # Where the runner token comes from when none was given: an OIDC exchange (github_actions groups).
    oidc: OidcSource | None
    _hidden = frozenset({"token"})

    def __init__(
        self, server: str, runner_id: str, run_id: str, token: str, work_dir: Path, launcher: str = "",
        grace: float = 10.0, keep_work_dir: bool = False, exit_file: Path | None = None, timeout: float = 30.0,
        oidc: OidcSource | None = None,
    ) -> None:  # fmt: skip
        self.server, self.runner_id, self.run_id, self.token, self.work_dir = server, runner_id, run_id, token, work_dir
        self.launcher, self.grace, self.keep_work_dir, self.exit_file = launcher, grace, keep_work_dir, exit_file
        self.timeout, self.oidc = timeout, oidc


class OidcSource(Frozen):
    """A GitHub OIDC token to exchange for the runner token: given (``GANTRY_OIDC_TOKEN``, ``_FILE``), or asked
    of GitHub Actions (``ACTIONS_ID_TOKEN_REQUEST_URL`` / ``_TOKEN``) for ``GANTRY_OIDC_AUDIENCE``."""

    __slots__ = ("audience", "correlation", "request_token", "request_url", "token")
    token: str
    request_url: str
    request_token: str
    audience: str
    correlation: str
    _hidden = frozenset({"token", "request_token"})

    def __init__(
        self, token: str = "", request_url: str = "", request_token: str = "", audience: str = "gantry",
        correlation: str = "",
    ) -> None:  # fmt: skip
        self._set(token=token, request_url=request_url, request_token=request_token)
        self._set(audience=audience, correlation=correlation)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OidcSource | None:
        token = env.get("GANTRY_OIDC_TOKEN", "") or _token_from_file(env.get("GANTRY_OIDC_TOKEN_FILE", ""))
        request_url = env.get("ACTIONS_ID_TOKEN_REQUEST_URL", "")
        request_token = env.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "")
        if not token and not (request_url and request_token):
            return None
        return cls(
            token=token, request_url=request_url, request_token=request_token,
            audience=env.get("GANTRY_OIDC_AUDIENCE") or "gantry", correlation=env.get("GANTRY_CORRELATION", ""),
        )  # fmt: skip

    def runner_token(self, client: GantryClient, runner_id: str) -> str:
        oidc_token = self.token or fetch_actions_oidc_token(self.request_url, self.request_token, self.audience)
        return client.oidc_exchange(runner_id, oidc_token, self.correlation)


def _token_from_file(path: str) -> str:
    """The runner token from a file a launcher put there (a container's copied-in file, a Pod's handed-over copy).

    Removed once read where the runner may (a copied-in file, the Kubernetes
    launcher's copy in a memory volume), so no step it runs can read it
    afterwards; a read-only mount stays.
    """
    if not path:
        return ""
    try:
        token = Path(path).read_text().strip()
    except OSError:
        return ""
    with contextlib.suppress(OSError):
        Path(path).unlink()
    return token


def _default_work_dir() -> str:
    import tempfile  # only without GANTRY_WORK_DIR (launchers set it): importing it costs a runner's start-up

    return str(Path(tempfile.gettempdir()) / "gantry-work")


def parse_args(argv: Sequence[str] | None = None) -> Config:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m runners.ephemeral",
        description="Run one Gantry run (ready, accept, steps, logs, done, deregister) and exit. "
        "Normally started by a coordinator's launcher; every flag has an environment variable, "
        "and the runner token is read from the environment only, so it never shows in ps.",
        epilog="Exit codes: 0 succeeded, cancelled, or already over (benign); 1 the run failed or was refused; "
        "2 credentials or configuration refused by the server; 3 server unreachable; 4 internal error.",
    )
    parser.add_argument("--server", default=env.get("GANTRY_SERVER"), help="service root URL [GANTRY_SERVER]")
    parser.add_argument("--runner-id", default=env.get("GANTRY_RUNNER_ID"), help="[GANTRY_RUNNER_ID]")
    parser.add_argument("--run-id", default=env.get("GANTRY_RUN_ID"), help="[GANTRY_RUN_ID]")
    parser.add_argument(
        "--work-dir",
        default=env.get("GANTRY_WORK_DIR") or _default_work_dir(),
        help="parent of the run's fresh work folder <dir>/<run id> [GANTRY_WORK_DIR; default $TMPDIR/gantry-work]",
    )
    parser.add_argument("--launcher", default=env.get("GANTRY_LAUNCHER", ""), help="reported to the server on ready")
    parser.add_argument(
        "--grace",
        type=float,
        default=env_number(parser, "GANTRY_STOP_GRACE", float, 10.0),
        help="seconds between SIGTERM and SIGKILL when a step is stopped [GANTRY_STOP_GRACE; default 10]",
    )
    parser.add_argument("--keep-work-dir", action="store_true", help="leave the work folder in place (debugging)")
    parser.add_argument(
        "--warm",
        metavar="NAME",
        help="warm mode (a coordinator's --warm): import, then wait for the run's GANTRY_* variables as one JSON "
        "line on stdin, then run it; end-of-file exits 0. NAME marks the process (runners.warm)",
    )
    parser.add_argument(
        "--zygote",
        metavar="NAME",
        help="the local launcher's fork server: import once, then fork warm runners on request over stdin (a "
        "Unix socket); runs nothing itself. NAME marks the process (runners.zygote)",
    )
    parser.add_argument("--log-level", default=env.get("GANTRY_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    check_range(parser, args.grace, "--grace (GANTRY_STOP_GRACE)", 0, None)
    token = env.get("GANTRY_RUNNER_TOKEN", "") or _token_from_file(env.get("GANTRY_RUNNER_TOKEN_FILE", ""))
    oidc = OidcSource.from_env(env) if not token else None
    missing = [
        name
        for name, value in (
            ("--server / GANTRY_SERVER", args.server),
            ("--runner-id / GANTRY_RUNNER_ID", args.runner_id),
            ("--run-id / GANTRY_RUN_ID", args.run_id),
            ("GANTRY_RUNNER_TOKEN (or GANTRY_RUNNER_TOKEN_FILE, or an OIDC token to exchange)", token or oidc),
        )
        if not value
    ]
    if missing:
        parser.error("missing: " + ", ".join(missing))
    logsetup.configure(args.log_level)
    exit_file = env.get("GANTRY_EXIT_FILE")
    return Config(
        server=args.server,
        runner_id=args.runner_id,
        run_id=args.run_id,
        token=token,
        work_dir=Path(args.work_dir),
        launcher=args.launcher,
        grace=args.grace,
        keep_work_dir=args.keep_work_dir,
        exit_file=Path(exit_file) if exit_file else None,
        oidc=oidc,
    )


class Result(Record):
    """How the run ended, as reported to /done."""

    __slots__ = ("error", "exit_code", "outcome")
    outcome: str  # succeeded | failure | cancelled
    exit_code: int | None
    error: str

    def __init__(self, outcome: str, exit_code: int | None, error: str = "") -> None:
        self.outcome, self.exit_code, self.error = outcome, exit_code, error


class RunLost(Exception):
    """The server no longer lets this runner report: the run ended without it, or the runner row is gone."""


class EphemeralRunner:
    def __init__(self, cfg: Config, client: GantryClient | None = None) -> None:
        self.cfg = cfg
        self.client = client or GantryClient(cfg.server, cfg.token, timeout=cfg.timeout)
        self.run_id = cfg.run_id
        self._cancel = threading.Event()  # the server asked for cancellation
        self._stop = threading.Event()  # we were told to stop (SIGTERM)
        self._lost = threading.Event()  # the server says the run is over without us
        self._lost_reason = ""
        self._done = threading.Event()  # ends the status thread
        self._wake = threading.Event()  # something the step loop must look at happened
        self._acked = False
        self.buf: LogBuffer | None = None
        self.shipper: LogShipper | None = None
        self.steplog: StepLog | None = None

    # ------------------------------------------------------------ entry

    def install_signal_handlers(self) -> None:
        import signal

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> int:
        started = time.monotonic()
        code = self._run()
        event(log, "runner.exit", "runner exits with %d after %.1fs", code, time.monotonic() - started,
              run_id=self.run_id, exit_code=code)  # fmt: skip
        return code

    def _run(self) -> int:
        cfg = self.cfg
        try:
            self.client.ready(
                cfg.runner_id, hostname=socket.gethostname(), launcher=cfg.launcher, pid=os.getpid(),
                workflow_run_id=_workflow_run_id(),
            )  # fmt: skip
        except ServerUnreachable as exc:
            return self._fault("runner.unreachable", f"ready: {exc}", EXIT_UNREACHABLE)
        except ApiError as exc:
            code = EXIT_UNREACHABLE if exc.transient else EXIT_REFUSED
            return self._fault("runner.refused", f"ready refused: {exc}", code)
        event(log, "runner.ready", "runner %s ready", cfg.runner_id, run_id=self.run_id, runner_id=cfg.runner_id)

        try:
            context = self.client.accept(self.run_id)
        except ApiError as exc:
            return self._accept_refused(exc)
        event(log, "run.accepted", "accepted run %s", self.run_id, run_id=self.run_id)

        try:
            result = self._execute(context)
        except RunLost as exc:
            event(log, "run.lost", "run %s ended without this runner: %s", self.run_id, exc,
                  level=logging.WARNING, run_id=self.run_id)  # fmt: skip
            if self.shipper is not None:
                self.shipper.finish(timeout=10)  # whatever storage still takes; no /done
            self._deregister()
            return EXIT_RUN_FAILED
        code = self._report(result)
        self._deregister()
        return code

    def _fault(self, name: str, message: str, code: int) -> int:
        event(log, name, message, level=logging.ERROR, run_id=self.run_id)
        return code

    def _accept_refused(self, exc: ApiError) -> int:
        if exc.code == "run_already_terminal":
            # Skipped or cancelled while we booted: someone's decision, not a fault.
            event(log, "run.already_terminal", "run %s is already over (%s); nothing to do", self.run_id,
                  exc.detail, run_id=self.run_id)  # fmt: skip
            self._deregister()
            return EXIT_OK
        if isinstance(exc, ServerUnreachable) or exc.transient:
            # The lease lapses and the run returns to pending for another runner.
            return self._fault("runner.unreachable", f"accept: {exc}", EXIT_UNREACHABLE)
        if exc.status == 409:
            # accept_response_undeliverable (the server failed the run: our first
            # accept's answer was lost) or a late arrival (lease lapsed, reassigned).
            event(log, "run.accept_refused", "accept refused: %s", exc, level=logging.WARNING,
                  run_id=self.run_id, code=exc.code)  # fmt: skip
            self._deregister()
            return EXIT_RUN_FAILED
        self._deregister()
        return self._fault("runner.refused", f"accept refused: {exc}", EXIT_REFUSED)

    def _deregister(self) -> None:
        try:
            self.client.deregister(self.cfg.runner_id, retry=DEREGISTER_RETRY)
            event(log, "runner.deregistered", "runner %s deregistered", self.cfg.runner_id, run_id=self.run_id)
        except ApiError as exc:
            if exc.status == 401:
                return  # the row is gone already (a reaper or force-delete took it)
            event(log, "runner.deregister_failed", "deregister failed: %s", exc, level=logging.WARNING,
                  run_id=self.run_id)  # fmt: skip

    # ------------------------------------------------------------ the run

    def _execute(self, context: dict[str, Any]) -> Result:
        # Imported here, after ready and accept: none of it is needed to get that far (docs/runners.md, Start-up).
        import shutil

        from runners.logbuf import LogBuffer, LogShipper
        from runners.masking import SecretMasker
        from runners.steps import StepLog

        spec = context.get("spec") or {}
        logs = context.get("logs") or {}
        self.buf = LogBuffer(
            chunk_size=int(logs.get("chunk_size_bytes") or 1 << 20),
            seal_interval=float(logs.get("seal_interval_s") or 30),
            max_bytes=int(logs.get("max_bytes") or 256 << 20),
        )
        self.shipper = LogShipper(
            self.client, self.run_id, self.buf, live_interval=float(logs.get("live_interval_s") or 2)
        )
        self.shipper.start()
        secrets = [str(v) for v in (context.get("secrets") or {}).values()]
        self.steplog = StepLog(self.buf, SecretMasker(secrets, self.buf.write))
        status_interval = float(context.get("status_interval_s") or 5)
        poller = threading.Thread(target=self._status_loop, args=(status_interval,), name="status", daemon=True)
        poller.start()

        work = self.cfg.work_dir / self.run_id
        shutil.rmtree(work, ignore_errors=True)  # fresh: never a previous attempt's leftovers
        work.mkdir(parents=True, mode=0o700)
        try:
            env = self._step_env(context, work)
            return self._run_steps(spec, env, work)
        finally:
            self.steplog.flush()
            self._done.set()
            if not self.cfg.keep_work_dir:
                shutil.rmtree(work, ignore_errors=True)

    def _step_env(self, context: dict[str, Any], work: Path) -> dict[str, str]:
        env = {name: os.environ[name] for name in STEP_INHERITED_ENV if name in os.environ}
        env.setdefault("PATH", DEFAULT_PATH)
        env.update((context.get("spec") or {}).get("env") or {})
        env.update(context.get("secrets") or {})
        # Ours last: a spec cannot spoof the run's identity or token.
        env.update(
            {
                "GANTRY_SERVER": self.cfg.server,
                "GANTRY_RUN_ID": self.run_id,
                "GANTRY_RUN_TOKEN": str(context.get("api_token") or ""),
                "GANTRY_WORK_DIR": str(work),
            }
        )
        return env

    def _run_steps(self, spec: dict[str, Any], env: dict[str, str], work: Path) -> Result:
        from runners.steps import EXIT_CANNOT_EXECUTE, STOP_WORDS, StepStartFailed, StepSupervisor

        steps = spec.get("steps") or []
        timeout = float(spec.get("timeout_seconds") or 3600)
        deadline = time.monotonic() + timeout
        assert self.steplog is not None
        supervisor = StepSupervisor(
            steplog=self.steplog,
            run_id=self.run_id,
            grace=self.cfg.grace,
            wake=self._wake,
            reason_to_stop=self._reason_to_stop,
            on_stopping=self._on_stopping,
        )
        for number, step in enumerate(steps, 1):
            reason = self._reason_to_stop(deadline)
            if reason is not None:
                self.steplog.notice(f"[gantry: {STOP_WORDS.get(reason, reason)}; remaining steps skipped]\n".encode())
                return self._interrupted(reason, None, timeout)
            label = f"[{number}/{len(steps)}] {step.get('name', '')}"
            self.steplog.notice(f"==> {label}\n".encode())
            event(log, "step.started", "step %s started", label, run_id=self.run_id, step=number)
            began = time.monotonic()
            try:
                code, why = supervisor.run(str(step["run"]), env, work, deadline)
            except StepStartFailed as exc:
                self.steplog.notice(f"==> {label}: {exc}\n".encode())
                return Result("failure", EXIT_CANNOT_EXECUTE, f"step {number} ({step.get('name', '')}): {exc}")
            took = time.monotonic() - began
            event(log, "step.finished", "step %s: %s, exit code %s", label, why, code, run_id=self.run_id,
                  step=number, exit_code=code, seconds=round(took, 3))  # fmt: skip
            if why == "exited":
                self.steplog.notice(f"==> {label}: exit code {code} ({took:.1f}s)\n".encode())
                if code != 0:
                    return Result("failure", code, f"step {number} ({step.get('name', '')}) exited with code {code}")
                continue
            self.steplog.notice(f"==> {label}: {why} after {took:.1f}s (exit code {code})\n".encode())
            return self._interrupted(why, code, timeout)
        return Result("succeeded", 0)

    def _interrupted(self, why: str, code: int | None, timeout: float) -> Result:
        from runners.steps import EXIT_TIMEOUT

        if why == "lost":
            raise RunLost(self._lost_reason)
        if why == "cancelled":
            return Result("cancelled", code, "cancelled on request")
        if why == "timed out":
            return Result("failure", EXIT_TIMEOUT, f"timed out after {timeout:g}s (the spec's timeout_seconds)")
        return Result("failure", code, "the runner was stopped (SIGTERM) before the run finished")

    def _reason_to_stop(self, deadline: float) -> str | None:
        if self._lost.is_set():
            return "lost"
        if self._cancel.is_set():
            return "cancelled"
        if self._stop.is_set():
            return "stopped"
        if time.monotonic() >= deadline:
            return "timed out"
        return None

    def _on_stopping(self, reason: str) -> None:
        if reason == "cancelled":
            self._acknowledge_cancel()

    def _acknowledge_cancel(self) -> None:
        if self._acked:
            return
        try:
            self.client.acknowledge_cancel(self.run_id)
            self._acked = True
            event(log, "run.cancel_acknowledged", "cancellation acknowledged", run_id=self.run_id)
        except ApiError as exc:
            event(log, "run.cancel_ack_failed", "acknowledging-cancel failed: %s", exc, level=logging.WARNING,
                  run_id=self.run_id)  # fmt: skip

    # ------------------------------------------------------------ status poll

    def _status_loop(self, interval: float) -> None:
        policy = RetryPolicy(attempts=3, base=0.5, cap=2.0)
        while not self._done.wait(interval):
            try:
                answer = self.client.status(self.run_id, retry=policy)
            except ApiError as exc:
                if exc.status in (401, 403, 404):
                    self._mark_lost(f"status refused: {exc}")
                    return
                event(log, "run.status_failed", "status poll failed: %s", exc, level=logging.WARNING,
                      run_id=self.run_id)  # fmt: skip
                continue
            status = str(answer.get("status"))
            if answer.get("cancel_requested") and not self._cancel.is_set():
                event(log, "run.cancel_requested", "cancellation requested", run_id=self.run_id)
                self._cancel.set()
                self._wake.set()
            if status in TERMINAL_STATUSES:
                self._mark_lost(f"the run is {status}")
                return

    def _mark_lost(self, reason: str) -> None:
        self._lost_reason = reason
        self._lost.set()
        self._wake.set()

    # ------------------------------------------------------------ the end

    def _report(self, result: Result) -> int:
        assert self.shipper is not None
        assert self.buf is not None
        shipped_from = time.monotonic()
        manifest: Manifest = self.shipper.finish()
        event(log, "log.shipped", "log: %d bytes in %d chunks (%d stored) in %.1fs", self.buf.recorded,
              manifest.count, manifest.uploaded, time.monotonic() - shipped_from, run_id=self.run_id,
              bytes=self.buf.recorded, chunks=manifest.count, stored=manifest.uploaded,
              live_pushes=self.shipper.live_pushes)  # fmt: skip
        if self._lost.is_set():
            event(log, "run.lost", "not reporting done: %s", self._lost_reason, level=logging.WARNING,
                  run_id=self.run_id)  # fmt: skip
            return EXIT_RUN_FAILED
        if result.outcome == "cancelled":
            self._acknowledge_cancel()
        try:
            self.client.done(
                self.run_id,
                outcome=result.outcome,
                exit_code=result.exit_code,
                sealed_chunks=manifest.count,
                manifest=manifest.as_dict(),
                error=result.error,
                retry=DONE_RETRY,
            )
        except ApiError as exc:
            level = EXIT_UNREACHABLE if exc.transient else EXIT_RUN_FAILED
            return self._fault("run.done_failed", f"done refused: {exc}", level)
        event(log, "run.done", "run %s: %s (exit code %s)", self.run_id, result.outcome, result.exit_code,
              run_id=self.run_id, outcome=result.outcome, exit_code=result.exit_code)  # fmt: skip
        return EXIT_OK if result.outcome in ("succeeded", "cancelled") else EXIT_RUN_FAILED


def _workflow_run_id() -> int | None:
    """Inside a GitHub Actions job: its workflow run id, for the ready call's metadata."""
    raw = os.environ.get("GITHUB_RUN_ID", "")
    return int(raw) if raw.isdigit() else None


def _write_exit_file(path: Path | None, code: int) -> None:
    """Tell the launcher how we ended (it cannot wait() for a process it did not start, after a restart)."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{code}\n")
        tmp.replace(path)


def _exchange(cfg: Config) -> int | None:
    """Get the runner token by the OIDC exchange, when that is where it comes from; an exit code if it fails."""
    if cfg.token or cfg.oidc is None:
        return None
    try:
        cfg.token = cfg.oidc.runner_token(GantryClient(cfg.server, timeout=cfg.timeout), cfg.runner_id)
    except ApiError as exc:
        code = EXIT_UNREACHABLE if exc.transient else EXIT_REFUSED
        event(log, "runner.oidc_refused", "OIDC exchange failed: %s", exc, level=logging.ERROR,
              run_id=cfg.run_id, code=exc.code)  # fmt: skip
        return code
    event(log, "runner.oidc_exchanged", "runner token obtained by OIDC exchange", run_id=cfg.run_id)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(arg.partition("=")[0] == "--zygote" for arg in args):
        # The local launcher's fork server (runners.zygote): it forks warm runners, it runs nothing itself.
        from runners import warm, zygote

        return zygote.serve(warm.split_warm(args, "--zygote")[0])
    if any(arg.partition("=")[0] == "--warm" for arg in args):
        # Warm (imported only then: a cold start pays nothing for it): wait here, imports
        # done, for the claim a cold runner finds in its environment (runners.warm).
        from runners import warm

        args, warm_name = warm.split_warm(args)
        ended = warm.await_claim(warm_name or "")
        if ended is not None:
            return ended
    cfg = parse_args(args)
    # Nothing we start may inherit the runner's credential, or the means to get one.
    for name in (*CREDENTIAL_ENV, "GANTRY_RUNNER_TOKEN", "GANTRY_RUNNER_TOKEN_FILE"):
        os.environ.pop(name, None)
    failed = _exchange(cfg)
    if failed is not None:
        _write_exit_file(cfg.exit_file, failed)
        return failed
    runner = EphemeralRunner(cfg)
    runner.install_signal_handlers()
    try:
        code = runner.run()
    except Exception:
        log.exception("internal error", extra={"event": "runner.crashed", "run_id": cfg.run_id})
        code = EXIT_INTERNAL
    _write_exit_file(cfg.exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
