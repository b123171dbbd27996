"""The local launcher: each runner is an OS process on the coordinator's host.

State folder (``--state-dir``)::

    workers/<run id>.json   one record per running worker: run, runner, pid, the
                            process's start time (clock ticks since boot) and
                            the command-line marker; written when the worker
                            starts, removed when it is reaped
    workers/<run id>.exit   the runner's exit code, written by the runner itself
                            (GANTRY_EXIT_FILE) so a restarted coordinator, which
                            cannot wait() for a process it did not start, learns it
    logs/<run id>.log       the runner's own stdout and stderr (JSON lines)
    logs/warm-<id>.log      a warm runner's, while it waits; renamed to
                            <run id>.log when it is handed its claim
    work/                   the runners' work folders (GANTRY_WORK_DIR)

Workers run in a session of their own (``start_new_session``), so they
survive the coordinator: a coordinator that is restarted (or killed) finds them
again through the records. A record is believed only if the pid is alive, its
start time is the recorded one and its command line names the run: a reused
pid is never mistaken for a worker.

The runner token travels in the worker's environment, never on its command
line (which any user can read with ``ps``).

Warm runners (``--warm N``, runners.warm): ``python -m runners.ephemeral
--warm warm-<id>`` started with the launcher's environment but nothing of a
run, its stdin a pipe from the coordinator. :meth:`LocalLauncher.assign_warm`
writes the worker record (its marker is the warm id on its command line), then
one JSON line with the run's environment (the token among it) to that pipe
and closes it; from then on it is an ordinary worker. A warm runner that reads
end-of-file (the coordinator stopped it, or died) exits 0 holding nothing, so
nothing of an idle warm runner is recorded or re-attached.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gantry_wire import procfs
from gantry_wire.logsetup import event
from gantry_wire.protocol import RUNNER_INHERITED_ENV
from launchers import register
from launchers.base import Assignment, Launcher, LaunchError, UnseenExit, WarmWorker, WorkerHandle
from launchers.zygote import ForkedChild, Zygote

log = logging.getLogger("gantry.launcher.local")

# The folder holding the `runners` and `gantry_wire` packages: the worker's working directory and PYTHONPATH.
CODE_ROOT = Path(__file__).resolve().parent.parent
MODULE = "runners.ephemeral"
# A warm runner that exits when its stdin closes should be gone within this; else it is killed.
WARM_STOP_WAIT = 2.0
# A worker this launcher started: a child process, or a warm runner its zygote forked.
Child = subprocess.Popen[bytes] | ForkedChild


@register("local")
class LocalLauncher(Launcher):
    supports_warm = True

    def __init__(
        self,
        state_dir: Path,
        *,
        python: str | None = None,
        work_dir: Path | None = None,
        pass_env: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        warm_fork: bool = True,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.python = python or sys.executable
        self.workers_dir = self.state_dir / "workers"
        self.logs_dir = self.state_dir / "logs"
        self.work_dir = Path(work_dir) if work_dir else self.state_dir / "work"
        self.pass_env = tuple(pass_env)
        self.extra_env = dict(extra_env or {})
        # Warm runners forked from a zygote (runners.zygote) rather than each a fresh interpreter.
        self.warm_fork = warm_fork
        self._zygote: Zygote | None = None
        self._zygote_lock = threading.Lock()
        for folder in (self.state_dir, self.workers_dir, self.logs_dir, self.work_dir):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Workers this process started: their Popen objects give exact exit codes and reap zombies.
        self._children: dict[str, Child] = {}
        # Workers discover() found ended, until the coordinator takes them.
        self._unseen: list[UnseenExit] = []
        # Warm runners waiting for a claim, by warm id: their stdin is the pipe the claim goes down.
        self._warm: dict[str, Child] = {}

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, state_dir: Path) -> Launcher:
        """Options: ``python`` (the interpreter runners start with), ``work_dir``, ``pass_env`` (NAME,NAME),
        ``warm_fork`` (true, the default: warm runners are forked from a zygote; false: each is a fresh
        interpreter)."""
        unknown = set(options) - {"python", "work_dir", "pass_env", "warm_fork"}
        if unknown:
            raise ValueError(f"unknown local launcher options: {', '.join(sorted(unknown))}")
        pass_env = [name for name in options.get("pass_env", "").split(",") if name]
        work_dir = Path(options["work_dir"]) if options.get("work_dir") else None
        fork = options.get("warm_fork", "true").strip().lower()
        if fork not in ("true", "false"):
            raise ValueError(f"local launcher option warm_fork: true or false, not {options['warm_fork']!r}")
        return cls(state_dir, python=options.get("python"), work_dir=work_dir, pass_env=pass_env,
                   warm_fork=fork == "true")  # fmt: skip

    # ------------------------------------------------------------ paths

    def _record(self, run_id: str) -> Path:
        return self.workers_dir / f"{run_id}.json"

    def _exit_file(self, run_id: str) -> Path:
        return self.workers_dir / f"{run_id}.exit"

    def log_file(self, run_id: str) -> Path:
        return self.logs_dir / f"{run_id}.log"

    # ------------------------------------------------------------ launch

    def _base_env(self) -> dict[str, str]:
        """What every runner this launcher starts gets, warm or cold: nothing of a run."""
        env = {name: os.environ[name] for name in (*RUNNER_INHERITED_ENV, *self.pass_env) if name in os.environ}
        env.update(self.extra_env)
        env.update(
            {
                "PYTHONPATH": str(CODE_ROOT),
                "PYTHONUNBUFFERED": "1",
                "GANTRY_WORK_DIR": str(self.work_dir),
                "GANTRY_LAUNCHER": "local",
            }
        )
        return env

    def _run_env(self, assignment: Assignment) -> dict[str, str]:
        """The run's part: in a cold runner's environment, or down a warm runner's stdin."""
        return {
            "GANTRY_SERVER": assignment.server,
            "GANTRY_RUN_ID": assignment.run_id,
            "GANTRY_RUNNER_ID": assignment.runner_id,
            "GANTRY_RUNNER_TOKEN": assignment.runner_token,
            "GANTRY_EXIT_FILE": str(self._exit_file(assignment.run_id)),
        }

    def _start(self, argv: list[str], env: dict[str, str], log_path: Path, *, stdin: int) -> subprocess.Popen[bytes]:
        try:
            with open(log_path, "ab") as output:
                return subprocess.Popen(
                    argv,
                    cwd=CODE_ROOT,
                    env=env,
                    stdin=stdin,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    # Its own session: the coordinator's Ctrl-C or death does not reach it.
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            # A missing or unusable interpreter will not fix itself; a resource
            # shortage (EAGAIN, ENOMEM, EMFILE) may.
            permanent = isinstance(exc, (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError))
            raise LaunchError(f"cannot start {self.python} -m {MODULE}: {exc}", permanent=permanent) from exc

    def launch(self, assignment: Assignment) -> WorkerHandle:
        # The run id on the command line (not a secret) is the marker that
        # tells our worker apart from whatever else might get its pid later.
        argv = [self.python, "-m", MODULE, "--run-id", assignment.run_id, "--launcher", "local"]
        self._exit_file(assignment.run_id).unlink(missing_ok=True)
        env = {**self._base_env(), **self._run_env(assignment)}
        proc = self._start(argv, env, self.log_file(assignment.run_id), stdin=subprocess.DEVNULL)
        handle = self._handle(assignment, proc, marker=assignment.run_id)
        self._children[assignment.run_id] = proc
        self._write_record(handle)
        self._watch(proc.pid)
        return handle

    def _handle(self, assignment: Assignment, proc: Child, *, marker: str) -> WorkerHandle:
        return WorkerHandle(
            kind=self.kind,
            run_id=assignment.run_id,
            runner_id=assignment.runner_id,
            ident=str(proc.pid),
            started_at=time.time(),
            meta={
                "pid": proc.pid,
                "start_ticks": procfs.start_ticks(proc.pid),
                "log": str(self.log_file(assignment.run_id)),
                "marker": marker,
            },
        )

    # ------------------------------------------------------------ warm runners

    def start_warm(self) -> WarmWorker:
        warm_id = f"warm-{uuid.uuid4().hex[:12]}"
        log_path = self.logs_dir / f"{warm_id}.log"
        if self.warm_fork:
            zygote = self._zygote_running()
            child = zygote.fork(warm_id, log_path)
            self._warm[warm_id] = child
            # Its command line is the zygote's: the zygote's name is the marker that tells it apart.
            return WarmWorker(kind=self.kind, ident=warm_id, started_at=time.time(),
                              meta={"pid": child.pid, "log": str(log_path), "marker": zygote.name})  # fmt: skip
        # The warm id on the command line is its marker, as the run id is a cold runner's.
        argv = [self.python, "-m", MODULE, "--warm", warm_id, "--launcher", "local"]
        proc = self._start(argv, self._base_env(), log_path, stdin=subprocess.PIPE)
        self._warm[warm_id] = proc
        self._watch(proc.pid)
        return WarmWorker(kind=self.kind, ident=warm_id, started_at=time.time(),
                          meta={"pid": proc.pid, "log": str(log_path)})  # fmt: skip

    def assign_warm(self, warm: WarmWorker, assignment: Assignment) -> WorkerHandle:
        proc = self._warm.get(warm.ident)
        if proc is None or not _child_alive(proc):
            raise LaunchError(f"warm runner {warm.ident} has exited")
        self._exit_file(assignment.run_id).unlink(missing_ok=True)
        handle = self._handle(assignment, proc, marker=warm.meta.get("marker") or warm.ident)
        # The record before the claim: a coordinator killed between the two
        # still leaves a record its successor re-attaches to.
        self._write_record(handle)
        message = json.dumps({"env": self._run_env(assignment)}).encode() + b"\n"
        try:
            assert proc.stdin is not None
            proc.stdin.write(message)
            proc.stdin.close()
        except OSError as exc:  # it died just now: it read nothing, holds nothing
            self._record(assignment.run_id).unlink(missing_ok=True)
            raise LaunchError(f"warm runner {warm.ident} cannot take its claim: {exc}") from exc
        # The open log file follows the rename: the worker's log is <run id>.log, as a cold one's.
        with contextlib.suppress(OSError):
            os.replace(warm.meta["log"], handle.meta["log"])
        del self._warm[warm.ident]
        self._children[assignment.run_id] = proc
        return handle

    def warm_alive(self, warm: WarmWorker) -> bool:
        proc = self._warm.get(warm.ident)
        return proc is not None and _child_alive(proc)

    def stop_warm(self, warm: WarmWorker) -> int | None:
        """Close its stdin (it exits 0 at end-of-file, holding nothing); kill it if it does not go at once."""
        proc = self._warm.pop(warm.ident, None)
        if proc is None:
            return None
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            code = proc.wait(WARM_STOP_WAIT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            code = proc.wait()
        Path(warm.meta["log"]).unlink(missing_ok=True)
        return code

    def warm_last_lines(self, warm: WarmWorker, limit: int = 20) -> list[str]:
        """The tail of a warm runner's own output (why it died, read before :meth:`stop_warm` deletes it)."""
        return _tail(Path(warm.meta["log"]), limit)

    def close_warm(self) -> None:
        with self._zygote_lock:
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.stop()

    def _zygote_running(self) -> Zygote:
        """The zygote, started (again) when there is none or it has ended."""
        with self._zygote_lock:
            if self._zygote is not None and not self._zygote.alive():
                self._zygote.stop()
                self._zygote = None
            if self._zygote is None:
                argv = [self.python, "-m", MODULE, "--launcher", "local"]
                self._zygote = Zygote(argv, cwd=CODE_ROOT, env=self._base_env(), logs_dir=self.logs_dir,
                                      on_exit=self.notify_exit)  # fmt: skip
                event(log, "warm.zygote_started", "started the warm runners' zygote %s (pid %d)",
                      self._zygote.name, self._zygote.proc.pid, zygote=self._zygote.name,
                      pid=self._zygote.proc.pid)  # fmt: skip
            return self._zygote

    def _watch(self, pid: int) -> None:
        """Tell the coordinator the moment this child exits, so it is reaped (and reported) at once.

        The wait looks without reaping (WNOWAIT): the zombie keeps its pid, and
        so its session's id, reserved until :meth:`reap` has swept the session.
        """

        def wait() -> None:
            # ChildProcessError: reaped already (the coordinator's periodic look got there first).
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            self.notify_exit()

        threading.Thread(target=wait, name=f"watch-{pid}", daemon=True).start()

    def _write_record(self, handle: WorkerHandle) -> None:
        record = {
            "run_id": handle.run_id,
            "runner_id": handle.runner_id,
            "pid": handle.meta["pid"],
            "start_ticks": handle.meta["start_ticks"],
            "started_at": handle.started_at,
            "marker": [MODULE, handle.meta.get("marker") or handle.run_id],
            "log": handle.meta["log"],
        }
        path = self._record(handle.run_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)  # atomic: a reader never sees half a record

    # ------------------------------------------------------------ discover / alive

    def discover(self) -> list[WorkerHandle]:
        """Workers recorded in the state folder that still run; records of finished ones are reaped here."""
        alive: list[WorkerHandle] = []
        for path in sorted(self.workers_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
                handle = WorkerHandle(
                    kind=self.kind,
                    run_id=str(record["run_id"]),
                    runner_id=str(record["runner_id"]),
                    ident=str(record["pid"]),
                    started_at=float(record["started_at"]),
                    meta={
                        "pid": int(record["pid"]),
                        "start_ticks": record.get("start_ticks"),
                        "log": record.get("log"),
                        # A warm-started worker's command line names its warm id, not its run.
                        "marker": str(record.get("marker", [MODULE, record["run_id"]])[1]),
                    },
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                event(log, "worker.bad_record", "ignoring unreadable worker record %s: %s", path, exc,
                      level=logging.WARNING)  # fmt: skip
                path.unlink(missing_ok=True)
                continue
            if self.is_alive(handle):
                alive.append(handle)
            else:
                lines = self.last_lines(handle)
                code = self.reap(handle)
                self._unseen.append(UnseenExit(handle, code, lines))
                event(log, "worker.exited", "worker for run %s exited with code %s (while no coordinator watched)",
                      handle.run_id, "unknown" if code is None else code, run_id=handle.run_id,
                      pid=handle.meta["pid"], exit_code=code)  # fmt: skip
        return alive

    def take_unseen_exits(self) -> list[UnseenExit]:
        taken, self._unseen = self._unseen, []
        return taken

    def is_alive(self, handle: WorkerHandle) -> bool:
        proc = self._children.get(handle.run_id)
        if proc is not None:
            return _child_alive(proc)
        marker = handle.meta.get("marker") or handle.run_id
        return _is_our_process(int(handle.meta["pid"]), handle.meta.get("start_ticks"), marker)

    def last_lines(self, handle: WorkerHandle, limit: int = 20) -> list[str]:
        """The tail of the runner's own log file (``logs/<run id>.log``)."""
        return _tail(Path(handle.meta.get("log") or self.log_file(handle.run_id)), limit)

    # ------------------------------------------------------------ terminate / reap

    def terminate(self, handle: WorkerHandle, grace: float = 10.0) -> None:
        pid = int(handle.meta["pid"])
        if not self.is_alive(handle):
            return
        # The runner stops its step on SIGTERM and reports the run failed.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.is_alive(handle):
            time.sleep(0.1)
        if self.is_alive(handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def reap(self, handle: WorkerHandle) -> int | None:
        pid = int(handle.meta["pid"])
        proc = self._children.pop(handle.run_id, None)
        # Before the runner is reaped (while a zombie still holds its pid), kill
        # what it left in its session: the steps of a runner that was killed.
        # A forked warm runner's zombie is its zygote's, which sweeps the session before it reaps.
        unreaped = isinstance(proc, subprocess.Popen) and proc.returncode is None
        swept = procfs.kill_session(pid, leader_is_zombie=unreaped)
        if swept:
            event(log, "worker.swept", "killed %d leftover process(es) of the worker for run %s", swept,
                  handle.run_id, run_id=handle.run_id, pid=pid)  # fmt: skip
        code: int | None = None
        if proc is not None:
            code = proc.wait()
        exit_file = self._exit_file(handle.run_id)
        if code is None:
            with contextlib.suppress(OSError, ValueError):
                code = int(exit_file.read_text().strip())
        exit_file.unlink(missing_ok=True)
        self._record(handle.run_id).unlink(missing_ok=True)
        return code


# ---------------------------------------------------------------- processes (gantry_wire.procfs)


def _tail(path: Path, limit: int) -> list[str]:
    """The last ``limit`` lines of a runner's own log file."""
    try:
        with open(path, "rb") as fh:
            # The tail only: a runner's own log is small, but never read it whole.
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            data = fh.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-limit:]


def _child_alive(proc: Child) -> bool:
    """Whether a child of ours still runs, looked at without reaping it."""
    if isinstance(proc, ForkedChild):
        return proc.alive()
    if proc.returncode is not None:
        return False
    try:
        # WNOWAIT: look without reaping, so the zombie keeps the pid
        # (and its session's id) reserved until reap() has swept it.
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return proc.poll() is None


def _is_our_process(pid: int, start_ticks: Any, marker: str) -> bool:
    """Whether ``pid`` is still the worker we started: alive, same start time, its ``marker`` (run id or warm id)
    on its command line."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process now: our worker runs as us
    fields = procfs.stat_fields(pid)
    if fields is None:
        return not Path("/proc").is_dir()  # no /proc: kill(0) is all we can know
    if fields[procfs.STATE] == b"Z":
        return False
    if start_ticks is not None and int(fields[procfs.START_TIME]) != int(start_ticks):
        return False  # the pid was reused
    argv = procfs.cmdline(pid)
    return MODULE.encode() in argv and marker.encode() in argv
