#!/usr/bin/env python3
"""Gantry's developer entry point.

Standard library only: it is the first thing a new machine runs, before
anything is installed. It keeps a virtualenv in ``.venv`` in step with
``requirements*.txt`` and runs everything through it.

    python3 dev.py run            migrate, admin user, demo data; serve on 127.0.0.1:8000 with a Celery
                                  worker (reapers) and a coordinator; queue a demo run and follow its log
    python3 dev.py run --demo-exit    the same, but stop after the demo run (exit 0 iff it succeeded);
                                  --no-demo skips the demo run
    python3 dev.py test [ARGS]    pytest; ARGS go to pytest (e.g. -k poll, -x, tests/ops)
    python3 dev.py check          ruff check, ruff format --check, mypy, makemigrations --check
    python3 dev.py setup          only create .venv and install requirements-dev.txt
    python3 dev.py manage ARGS    manage.py ARGS with the environment `run` gives its processes (the embedded
                                  databases unless DATABASE_URL / REDIS_URL are set), e.g. manage help
    python3 dev.py runner-image [--base IMAGE] [--tag TAG]
                                  build the Docker launcher's runner image (runners/Dockerfile; default
                                  base python:3.11-slim, tag gantry-runner:local)
    python3 dev.py stop           stop the embedded PostgreSQL and Redis of the data folder

With ``DATABASE_URL`` / ``REDIS_URL`` unset, Django's settings start an
embedded PostgreSQL and Redis under the data folder (``GANTRY_DATA_DIR``,
default ``.gantry-data``); they keep running after ``run`` exits so the next
start is quick. ``stop`` ends them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

if sys.version_info < (3, 11):  # noqa: UP036 - the check is for whoever runs this with an old python3
    sys.exit(f"Gantry needs Python 3.11 or newer; this is {sys.version.split()[0]}.")

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from gantry_wire import procfs  # noqa: E402 - standard library only, like this script; needs ROOT on the path

VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
# The sha256 of the requirements files the venv was last installed from:
# equal means "nothing to install", which keeps `dev.py test` instant.
STAMP = VENV / ".gantry-requirements.sha256"
DEV_REQUIREMENTS = ROOT / "requirements-dev.txt"

DEFAULT_PORT = 8000
DEMO_ORG = "demo"
DEMO_STACK = "hello"
# In the data folder, mode 0600: the demo group's token, for the coordinator `run` starts.
DEMO_TOKEN_FILE = "demo-group-token"
# The demo run prints for a few seconds; a first start also waits for the reapers' and runner's start-up.
DEMO_TIMEOUT = 300.0


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


# ---------------------------------------------------------------------------
# The virtualenv
# ---------------------------------------------------------------------------


def requirements_digest() -> str:
    """One digest over every requirements file (dev includes runtime via -r)."""
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("requirements*.txt")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def ensure_venv() -> Path:
    """Create ``.venv`` if missing and install the requirements when they changed; return its python."""
    if not VENV_PYTHON.exists():
        say(f"creating the virtualenv {VENV.relative_to(ROOT)}")
        try:
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        except subprocess.CalledProcessError:
            # A half-made venv would be taken for a good one next time.
            shutil.rmtree(VENV, ignore_errors=True)
            sys.exit("Could not create .venv. On Debian/Ubuntu: apt-get install python3-venv")
    digest = requirements_digest()
    if STAMP.exists() and STAMP.read_text().strip() == digest:
        return VENV_PYTHON
    say(f"installing {DEV_REQUIREMENTS.name} into .venv (the first time takes a few minutes)")
    subprocess.run(
        [str(VENV_PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", str(DEV_REQUIREMENTS)],
        check=True,
        cwd=ROOT,
    )
    # Written only after a successful install, so a failed one is retried.
    STAMP.write_text(digest + "\n")
    return VENV_PYTHON


def venv_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for commands run in the venv, as if it were activated."""
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = str(VENV)
    # Tools and tests that spawn `gunicorn`, `celery` or `python` find the venv's.
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("DJANGO_SETTINGS_MODULE", "gantry.settings")
    # The development path: without DATABASE_URL / REDIS_URL, the embedded databases (settings refuse them otherwise).
    env.setdefault("GANTRY_EMBEDDED", "1")
    env.update(extra or {})
    return env


def data_dir() -> Path:
    """The data folder; the same rule as ``gantry.conf.data_dir`` (which this script cannot import)."""
    path = Path(os.environ.get("GANTRY_DATA_DIR") or ROOT / ".gantry-data").expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def manage(python: Path, *args: str, env: dict[str, str] | None = None, capture: bool = False) -> str:
    """Run ``manage.py ARGS``; fail loudly (with its output) when it fails."""
    result = subprocess.run(
        [str(python), "manage.py", *args],
        cwd=ROOT,
        env=env or venv_env(),
        text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    if result.returncode != 0:
        sys.exit(f"manage.py {' '.join(args)} failed (exit {result.returncode})")
    return result.stdout or ""


# ---------------------------------------------------------------------------
# test / check / setup
# ---------------------------------------------------------------------------


def test_redis_db(redis_url: str | None) -> str:
    """The Redis database the tests use: eight above the configured one (0 for the embedded Redis), so a
    test run never touches a running server's data in the same Redis; respects a GANTRY_REDIS_DB given."""
    given = os.environ.get("GANTRY_REDIS_DB")
    if given:
        return given
    path = urllib.parse.urlsplit(redis_url or "").path.strip("/")
    return str(((int(path) if path.isdigit() else 0) + 8) % 16)


def cmd_test(args: Sequence[str]) -> int:
    python = ensure_venv()
    env = venv_env({"GANTRY_REDIS_DB": test_redis_db(os.environ.get("REDIS_URL"))})
    # pytest's own exit code, unchanged: 5 means "no tests collected", which
    # .ci/run treats as a failure.
    return subprocess.run([str(python), "-m", "pytest", *args], cwd=ROOT, env=env).returncode


def cmd_check(args: Sequence[str]) -> int:
    python = ensure_venv()
    py = str(python)
    steps: list[tuple[str, list[str]]] = [
        ("ruff check", [py, "-m", "ruff", "check", "."]),
        ("ruff format --check", [py, "-m", "ruff", "format", "--check", "."]),
        ("mypy", [py, "-m", "mypy", "."]),
        ("makemigrations --check", [py, "manage.py", "makemigrations", "--check", "--dry-run"]),
    ]
    # Run every step even after a failure: one pass shows all there is to fix.
    failed: list[str] = []
    for name, argv in steps:
        say(name)
        started = time.monotonic()
        code = subprocess.run(argv, cwd=ROOT, env=venv_env()).returncode
        print(f"    {name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {time.monotonic() - started:.1f}s")
        if code != 0:
            failed.append(name)
    if failed:
        print(f"check failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("check passed")
    return 0


def cmd_manage(args: Sequence[str]) -> int:
    """``manage.py ARGS`` in the venv with ``run``'s environment; its exit status, unchanged."""
    python = ensure_venv()
    return subprocess.run([str(python), "manage.py", *args], cwd=ROOT, env=venv_env()).returncode


def cmd_setup(args: Sequence[str]) -> int:
    ensure_venv()
    print(f"ready: {VENV_PYTHON.relative_to(ROOT)}")
    return 0


def _context_entry(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Build-context entries without bytecode, owned by root, dated 0: the same tree always makes the
    same context, so Docker's build cache holds until a file really changes."""
    if "__pycache__" in info.name.split("/") or info.name.endswith(".pyc"):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def cmd_runner_image(args: Sequence[str]) -> int:
    """Build the runner image from a context of just runners/Dockerfile, runners/ and gantry_wire/ (a tar on stdin)."""
    parser = argparse.ArgumentParser(prog="python3 dev.py runner-image", description="Build the runner image.")
    parser.add_argument("--base", default="python:3.11-slim", help="BASE_IMAGE: any image with python3 3.11+")
    parser.add_argument("--tag", default="gantry-runner:local", help="the image's tag (default gantry-runner:local)")
    opts = parser.parse_args(args)
    docker = shutil.which("docker")
    if docker is None:
        sys.exit("dev.py runner-image needs the docker command (Debian: apt-get install docker.io)")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        tar.add(ROOT / "runners" / "Dockerfile", arcname="Dockerfile", filter=_context_entry)
        for package in ("runners", "gantry_wire"):  # the runner and the package it shares with the server
            for path in sorted((ROOT / package).iterdir()):
                if path.name != "Dockerfile":
                    tar.add(path, arcname=f"{package}/{path.name}", filter=_context_entry)
    say(f"building {opts.tag} on {opts.base}")
    argv = [docker, "build", "--network", "none", "--build-arg", f"BASE_IMAGE={opts.base}", "--tag", opts.tag, "-"]
    return subprocess.run(argv, input=context.getvalue()).returncode


# ---------------------------------------------------------------------------
# Process supervision
# ---------------------------------------------------------------------------


@dataclass
class Supervisor:
    """Runs child processes in the foreground until one of them exits or we are told to stop.

    Each child gets its own process group, so a Ctrl-C at the terminal reaches
    only this script; it passes the stop on exactly once, as SIGTERM, which
    gunicorn, Celery and the coordinator all treat as "finish what you are
    doing and exit". A second Ctrl-C kills at once. When any child exits, the
    others are stopped too: a half-running stack is worse than none.
    """

    grace_seconds: float = 30.0
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _signals: int = 0

    def __post_init__(self) -> None:
        # From here on a Ctrl-C must reach the children through us, never leave them orphaned.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

    @property
    def stopping(self) -> bool:
        return self._signals > 0

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        say(f"starting {name}: {' '.join(argv)}")
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, process_group=0)
        self.children[name] = proc
        return proc

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            self._kill_all()

    def exited(self) -> tuple[str, int] | None:
        for name, proc in self.children.items():
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    def wait(self) -> int:
        """Block until a child exits or a stop signal arrives; stop the rest; return an exit code."""
        code = 0
        while not self.stopping:
            done = self.exited()
            if done:
                name, code = done
                print(f"{name} exited with {code}; stopping the others", file=sys.stderr)
                # Nothing should exit by itself, so even a 0 is a failure of `run`;
                # a death by signal reads as a negative code: report it the shell's way.
                code = 128 - code if code < 0 else (code or 1)
                break
            time.sleep(0.2)
        self.stop()
        return code

    def stop(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                # The group leader only: gunicorn's master stops its own workers.
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in self.children.values()):
            time.sleep(0.1)
        self._kill_all()

    def _kill_all(self) -> None:
        for proc in self.children.values():
            # The whole group, even when its leader is gone: no stray grandchildren.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ensure_superuser(python: Path) -> tuple[str, str | None]:
    """Create the admin user with the stock ``createsuperuser --noinput`` unless it exists.

    Returns the username and the password when known: given in
    DJANGO_SUPERUSER_PASSWORD, or generated on first start and kept in the
    data folder so later starts can print it again.
    """
    username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin"
    email = os.environ.get("DJANGO_SUPERUSER_EMAIL") or f"{username}@example.com"
    password_file = data_dir() / "admin-password"
    password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
    if not password and password_file.exists():
        password = password_file.read_text().strip()

    env = venv_env({"DJANGO_SUPERUSER_USERNAME": username, "DJANGO_SUPERUSER_EMAIL": email})
    exists = subprocess.run(
        [
            str(python),
            "manage.py",
            "shell",
            "-c",
            "import os, sys; from django.contrib.auth import get_user_model; "
            "sys.exit(0 if get_user_model().objects.filter("
            "username=os.environ['DJANGO_SUPERUSER_USERNAME']).exists() else 3)",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    ).returncode
    if exists == 0:
        say(f"admin user {username!r} exists")
        return username, password
    if exists != 3:
        sys.exit("could not check whether the admin user exists (see the error above)")

    if not password:
        password = secrets.token_urlsafe(12)
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
    say(f"creating admin user {username!r}")
    manage(python, "createsuperuser", "--noinput", env={**env, "DJANGO_SUPERUSER_PASSWORD": password})
    return username, password


def api_token(python: Path, username: str) -> str | None:
    """The user's DRF API token, through the stock ``drf_create_token`` (it returns an existing one)."""
    out = manage(python, "drf_create_token", username, capture=True)
    match = re.search(r"token (\S+) for user", out)
    return match.group(1) if match else None


def wait_until_serving(base_url: str, supervisor: Supervisor, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not supervisor.exited() and not supervisor.stopping:
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    return False


def demo_stack_id(base_url: str, token: str) -> int | None:
    """Ask the running server for the demo stack's id, for a copy-and-paste curl line."""
    request = urllib.request.Request(
        f"{base_url}/api/v1/orgs/{DEMO_ORG}/stacks", headers={"Authorization": f"Token {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            stacks = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    for stack in stacks if isinstance(stacks, list) else []:
        if isinstance(stack, dict) and stack.get("name") == DEMO_STACK:
            return int(stack["id"])
    return None


def print_banner(
    base_url: str, username: str, password: str | None, token: str | None, stack_id: int | None, embedded: bool
) -> None:
    auth = f"Authorization: Token {token or '<api token: python3 dev.py manage drf_create_token ' + username + '>'}"
    shown_password = password or "(set earlier; change it with: python3 dev.py manage changepassword " + username + ")"
    stack = stack_id if stack_id is not None else "<stack id>"
    stop = " (the embedded PostgreSQL and Redis keep running: python3 dev.py stop)" if embedded else ""
    print(
        f"""
  Gantry is running.

  Admin      {base_url}/admin/
  User       {username}
  Password   {shown_password}
  API        {base_url}/api/v1   (schema: {base_url}/api/v1/schema)

  Running    the web server, a Celery worker with beat (the reapers), and a coordinator
             for the demo runner group that starts each run as a local process
             (its state and the runners' own logs: {data_dir() / "coordinator"})

  Try:
    curl -H '{auth}' {base_url}/api/v1/orgs/{DEMO_ORG}/stacks
    curl -X POST -H '{auth}' -H 'Content-Type: application/json' -d '{{}}' \\
        {base_url}/api/v1/stacks/{stack}/deployments
    curl -H '{auth}' '{base_url}/api/v1/runs/<run id>/logs?offset=0'

  Ctrl-C stops them all; runs in progress finish by themselves{stop}.

  Queue page {base_url}/orgs/{DEMO_ORG}/queue
  Log in as  {username} / {shown_password}
""",
        flush=True,
    )


def processes(python: Path, port: int) -> list[tuple[str, list[str]]]:
    """What `run` keeps running, in start order: the server, Celery (reapers), the demo group's coordinator."""
    root = data_dir()
    procs = [
        (
            "web",
            # Production's server mode (docs/operations.md, "Serving"), one
            # worker: parked long polls hold no thread, and the runner's hot
            # calls take the fast lane, so development runs what production
            # runs. No control socket: its default path is shared by every
            # gunicorn of the user, and a second server (a test's) would take
            # it over. Parked long polls answer at once on SIGTERM (gantry.asgi
            # chains its handler); the short graceful timeout is a backstop for
            # any other slow request. A cut poll is retried by its coordinator.
            [
                *(str(python), "-m", "gunicorn", "gantry.asgi", "-b", f"127.0.0.1:{port}"),
                *("--worker-class", "uvicorn_worker.UvicornWorker", "--workers", "1", "--no-control-socket"),
                *("--graceful-timeout", "5"),
            ],
        ),
    ]
    # One worker with the beat scheduler inside (-B): the reapers run every
    # GANTRY_REAPER_INTERVAL seconds. One process is plenty on a laptop; the
    # schedule file lives in the data folder, not in the checkout. Gantry uses
    # neither gossip nor mingle; without them a worker rides out a Redis restart.
    celery = [str(python), "-m", "celery", "-A", "gantry", "worker", "-B", "--concurrency", "1"]
    celery += ["--without-gossip", "--without-mingle", "--loglevel", "INFO"]
    celery += ["--schedule", str(root / "celerybeat-schedule")]
    procs.append(("celery", celery))
    procs.append(
        (
            "coordinator",
            # The demo group's coordinator; its token comes from a 0600 file
            # (never argv, which `ps` shows). Workers are local processes.
            [
                *(str(python), "-m", "runners.coordinator", "--server", f"http://127.0.0.1:{port}"),
                *("--token-file", str(root / DEMO_TOKEN_FILE), "--launcher", "local"),
                *("--state-dir", str(root / "coordinator"), "--max-parallel", "4"),
            ],
        )
    )
    return procs


# ---------------------------------------------------------------------------
# The demo run
# ---------------------------------------------------------------------------


def api_call(base_url: str, token: str, method: str, path: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base_url}{path}", data=data, method=method)
    request.add_header("Authorization", f"Token {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def queue_demo_run(base_url: str, token: str, stack_id: int) -> str | None:
    try:
        deployment = api_call(base_url, token, "POST", f"/api/v1/stacks/{stack_id}/deployments", {})
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"could not queue the demo deployment: {exc}", file=sys.stderr)
        return None
    assert isinstance(deployment, dict)
    run_id = str(deployment["run"]["id"])
    say(f"queued a demo deployment of stack {DEMO_STACK!r}: run {run_id}; following its log")
    return run_id


def follow_run(base_url: str, token: str, run_id: str, supervisor: Supervisor, timeout: float) -> str | None:
    """Print the run's log as it grows until the run ends; answer its final status (None if we stopped first)."""
    offset = 0
    pending = ""
    status = ""
    deadline = time.monotonic() + timeout
    while not supervisor.stopping and not supervisor.exited() and time.monotonic() < deadline:
        try:
            # The status first, the log second: a run seen terminal has its whole log in storage.
            run = api_call(base_url, token, "GET", f"/api/v1/runs/{run_id}")
            assert isinstance(run, dict)
            page = api_call(base_url, token, "GET", f"/api/v1/runs/{run_id}/logs?offset={offset}")
            assert isinstance(page, dict)
            pending += str(page["text"])
            offset = int(page["next_offset"])
            *lines, pending = pending.split("\n")
            for line in lines:
                print(f"    | {line}", flush=True)
            if run["status"] != status:
                status = str(run["status"])
                print(f"    [run {status}]", flush=True)
            # final: the run has ended and nothing more will come (complete, or with a line saying what was lost).
            if page["final"]:
                if pending:
                    print(f"    | {pending}", flush=True)
                return status
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            print(f"    (following the demo run: {exc})", file=sys.stderr, flush=True)
        time.sleep(1)
    if time.monotonic() >= deadline:
        print(f"    the demo run did not finish within {timeout:.0f}s (status: {status or 'unknown'})", flush=True)
    return None


def cmd_run(args: Sequence[str]) -> int:
    demo_exit = "--demo-exit" in args or os.environ.get("GANTRY_DEMO_EXIT", "").lower() in ("1", "true", "yes")
    demo = "--no-demo" not in args
    unknown = [a for a in args if a not in ("--demo-exit", "--no-demo")]
    if unknown:
        sys.exit(f"dev.py run: unknown arguments {' '.join(unknown)} (known: --demo-exit, --no-demo)")
    python = ensure_venv()
    raw_port = os.environ.get("GANTRY_PORT") or str(DEFAULT_PORT)
    if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
        sys.exit(f"GANTRY_PORT={raw_port!r} is not a TCP port number")
    port = int(raw_port)
    if port_in_use(port):
        sys.exit(f"port {port} on 127.0.0.1 is taken; set GANTRY_PORT to another port")

    embedded = not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL")
    if embedded:
        say(f"DATABASE_URL/REDIS_URL unset: embedded servers under {data_dir()} (the first start takes a few seconds)")
    say("migrating the database")
    manage(python, "migrate", "--noinput")
    username, password = ensure_superuser(python)
    say("setting up the demo organization")
    # The demo group's token goes to a 0600 file the coordinator reads (rotated when stale).
    manage(python, "demo_setup", "--admin", username, "--token-file", str(data_dir() / DEMO_TOKEN_FILE))
    token = api_token(python, username)

    base_url = f"http://127.0.0.1:{port}"
    env = venv_env({"PYTHONUNBUFFERED": "1"})
    supervisor = Supervisor()
    for name, argv in processes(python, port):
        supervisor.start(name, argv, env)
    outcome: str | None = None
    if wait_until_serving(base_url, supervisor):
        stack_id = demo_stack_id(base_url, token) if token else None
        if demo and token and stack_id is not None:
            run_id = queue_demo_run(base_url, token, stack_id)
            if run_id:
                outcome = follow_run(base_url, token, run_id, supervisor, timeout=DEMO_TIMEOUT)
                if outcome:
                    say(f"demo run {run_id}: {outcome}")
        print_banner(base_url, username, password, token, stack_id, embedded)
    if demo_exit:
        # For CI and tests: the whole path from a fresh clone to a finished run, then stop.
        supervisor.stop()
        return 0 if outcome == "succeeded" else 1
    return supervisor.wait()


# ---------------------------------------------------------------------------
# stop
# ---------------------------------------------------------------------------


def _read_pid(path: Path) -> int | None:
    try:
        first = path.read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(first) if first.isdigit() else None


def stop_process(pid_file: Path, *, expect: str, signum: signal.Signals, timeout: float = 30.0) -> int | None:
    """Signal the process named in ``pid_file`` and wait for it to exit; return its pid if one was running.

    ``expect`` must occur in its command line (where /proc tells), so a stale
    pid file never gets an unrelated process signalled.
    """
    pid = _read_pid(pid_file)
    if pid is None or not procfs.running(pid):
        return None
    cmdline = b" ".join(procfs.cmdline(pid)).decode(errors="replace")
    if cmdline and expect not in cmdline:
        return None
    os.kill(pid, signum)
    deadline = time.monotonic() + timeout
    while procfs.running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if procfs.running(pid):
        os.kill(pid, signal.SIGKILL)
    return pid


def cmd_stop(args: Sequence[str]) -> int:
    root = data_dir()
    pgdata = root / "postgres"
    # SIGINT is PostgreSQL's "fast" shutdown: roll back open sessions, checkpoint, exit.
    pg = stop_process(pgdata / "postmaster.pid", expect=str(pgdata), signum=signal.SIGINT)
    redis = stop_process(root / "redis" / "redis.pid", expect="redis-server", signum=signal.SIGTERM)
    print(f"PostgreSQL: {f'stopped (pid {pg})' if pg else 'not running'}")
    print(f"Redis: {f'stopped (pid {redis})' if redis else 'not running'}")
    return 0


# ---------------------------------------------------------------------------

COMMANDS = {
    "run": cmd_run,
    "test": cmd_test,
    "check": cmd_check,
    "setup": cmd_setup,
    "manage": cmd_manage,
    "stop": cmd_stop,
    "runner-image": cmd_runner_image,
}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help", "help") else 2
    os.chdir(ROOT)
    try:
        return COMMANDS[argv[0]](argv[1:])
    except KeyboardInterrupt:
        # Ctrl-C before the supervisor took over (during install or migrate):
        # the foreground command got it too; no traceback for a deliberate stop.
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
