"""Warm runners (the coordinator's ``--warm N``; docs/runners.md, "Warm runners").

A cold runner pays for its interpreter and its imports after its run was
claimed. A warm one has paid before: the coordinator keeps ``N`` runners
started and waiting, each holding no run and no credential, and hands one
its claim (run id, runner id, runner token, server URL) when a poll brings
one. The runner then does exactly what a cold one does (``ready``,
``accept``, the steps, ``done``): the protocol does not know it was warm.

Two halves live here:

- the runner's: ``python -m runners.ephemeral --warm NAME`` imports what a run
  needs, then reads one JSON line from its stdin, ``{"env": {...}}``, the
  variables a cold runner finds in its environment (only those named in
  ``CLAIM_ENV``); end-of-file instead means "not needed": exit 0 holding
  nothing. The launcher owns the pipe (a process's stdin, a container's);
  ``NAME`` only marks the process (``ps``, the launcher's records).
- the coordinator's: :class:`WarmPool`, the idle warm runners, topped up to
  ``N`` by the reconciler's turns (so a warm runner that dies while waiting is
  replaced within one turn, and at once where the launcher reports exits),
  emptied on shutdown. A warm runner that dies while waiting touches no run:
  it never had one. ``--max-parallel`` counts busy workers only.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, BinaryIO

from gantry_wire import logsetup
from gantry_wire.logsetup import event
from runners.client import Backoff, RetryPolicy

if TYPE_CHECKING:
    # The coordinator's half only: the runner image (runners/Dockerfile) has no launchers package, and
    # its warm runner imports this module. The pool's methods import LaunchError where they catch it.
    from launchers.base import Assignment, Launcher, WarmWorker, WorkerHandle

log = logging.getLogger("gantry.coordinator")

# The variables a claim may set in a warm runner: what a cold runner gets from its launcher for its run.
CLAIM_ENV = frozenset(
    {"GANTRY_SERVER", "GANTRY_RUN_ID", "GANTRY_RUNNER_ID", "GANTRY_RUNNER_TOKEN", "GANTRY_RUNNER_TOKEN_FILE",
     "GANTRY_EXIT_FILE"}
)  # fmt: skip
# A claim is a few hundred bytes; a longer line is not one.
CLAIM_MAX_BYTES = 64 * 1024
# What a run needs, imported while the runner waits (that is the point of being warm). Named
# here, not only reached through runners.ephemeral, so modules it imports lazily are paid for too.
PRELOAD = ("runners.client", "runners.logbuf", "runners.steps", "runners.masking",
           "http.client", "gzip", "hashlib", "subprocess")  # fmt: skip
# A warm runner that dies sooner than this after its start counts as a failed start: the
# pool backs off before it starts the next (an interpreter that cannot import would spin).
MIN_LIFE = 5.0
EXIT_OK = 0
EXIT_BAD_CLAIM = 4


# ---------------------------------------------------------------- the runner's half


def split_warm(argv: Sequence[str], flag: str = "--warm") -> tuple[list[str], str | None]:
    """``argv`` without ``--warm NAME`` (or ``--warm=NAME``; ``flag`` names another such option), and NAME;
    None when the option is absent."""
    rest: list[str] = []
    name: str | None = None
    items = iter(argv)
    for item in items:
        if item == flag:
            name = next(items, "")
        elif item.startswith(flag + "="):
            name = item.partition("=")[2]
        else:
            rest.append(item)
    return rest, name


def await_claim(name: str, stdin: BinaryIO | None = None) -> int | None:
    """Preload, wait for the claim on ``stdin``, put it in ``os.environ``; None to go on with the run, or
    the exit code (0: end-of-file, not needed; 4: a malformed claim)."""
    for module in PRELOAD:
        importlib.import_module(module)
    stream = stdin if stdin is not None else sys.stdin.buffer
    line = stream.readline(CLAIM_MAX_BYTES + 1)
    # Nothing a step runs may read from the coordinator's pipe (steps get /dev/null anyway).
    _detach_stdin()
    if not line:
        return EXIT_OK
    problem, env = parse_claim(line)
    if problem:
        logsetup.configure(os.environ.get("GANTRY_LOG_LEVEL", "INFO"))
        event(logging.getLogger("gantry.runner"), "runner.warm_bad_claim", "refusing the claim: %s", problem,
              level=logging.ERROR, warm=name)  # fmt: skip
        return EXIT_BAD_CLAIM
    os.environ.update(env)
    return None


def parse_claim(line: bytes) -> tuple[str, dict[str, str]]:
    """The claim's variables from its JSON line, or why it is not one (a non-empty problem)."""
    if len(line) > CLAIM_MAX_BYTES:
        return f"the claim is longer than {CLAIM_MAX_BYTES} bytes", {}
    try:
        body = json.loads(line)
    except ValueError as exc:
        return f"the claim is not JSON: {exc}", {}
    env = body.get("env") if isinstance(body, dict) else None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return 'the claim is not {"env": {NAME: "value", ...}}', {}
    unknown = sorted(set(env) - CLAIM_ENV)
    if unknown:
        return f"the claim sets variables a claim does not carry: {', '.join(unknown)}", {}
    return "", env


def _detach_stdin() -> None:
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return
    os.dup2(devnull, 0)
    os.close(devnull)


# ---------------------------------------------------------------- the coordinator's half


class WarmPool:
    """Up to ``size`` idle warm runners of ``launcher``; safe from the poll loop and the reconciler at once."""

    def __init__(self, launcher: Launcher, size: int, backoff: RetryPolicy) -> None:
        self.launcher = launcher
        self.size = size
        self._lock = threading.Lock()
        self._idle: list[WarmWorker] = []
        self._backoff = Backoff(backoff)
        self._start_after = 0.0  # monotonic: after warm runners died young, no start before this
        self._closed = False
        # For tests and metrics.
        self.started = 0
        self.handed = 0
        self.died = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle)

    def idle(self) -> list[WarmWorker]:
        with self._lock:
            return list(self._idle)

    def take(self, assignment: Assignment) -> WorkerHandle | None:
        """Hand the claim to the oldest waiting warm runner (the likeliest to be done importing); None when
        none can take it (the caller launches cold)."""
        from launchers.base import LaunchError

        while True:
            with self._lock:
                if not self._idle:
                    return None
                warm = self._idle.pop(0)
            try:
                handle = self.launcher.assign_warm(warm, assignment)
            except LaunchError as exc:
                # It died while waiting: it held nothing; the next one (or a cold launch) takes the claim.
                self._forget(warm, f"could not take run {assignment.run_id}: {exc.message}")
                continue
            except Exception:  # a launcher bug must not strand the claim: stop this one, launch cold
                log.exception("launcher error handing a claim to a warm runner",
                              extra={"event": "warm.crashed", "run_id": assignment.run_id})  # fmt: skip
                self._forget(warm, f"could not take run {assignment.run_id}: launcher error")
                return None
            self.handed += 1
            self._backoff.succeeded()
            return handle

    def maintain(self) -> None:
        """Forget the warm runners that died (no run is touched: they held none) and start new ones up to size."""
        from launchers.base import LaunchError

        for warm in self.idle():
            if not self.launcher.warm_alive(warm):
                with self._lock:
                    if warm not in self._idle:
                        continue  # taken meanwhile: the taker saw it die and forgot it
                    self._idle.remove(warm)
                self._forget(warm, "died while waiting")
        while True:
            with self._lock:
                if self._closed or len(self._idle) >= self.size or time.monotonic() < self._start_after:
                    return
            try:
                warm = self.launcher.start_warm()
            except LaunchError as exc:
                delay = self._backoff.failed()
                self._start_after = time.monotonic() + delay
                event(log, "warm.start_failed", "cannot start a warm runner (%s); next try in %.1fs",
                      exc.message, delay, level=logging.WARNING, seconds=round(delay, 3),
                      failures=self._backoff.failures)  # fmt: skip
                return
            with self._lock:
                closed = self._closed
                if not closed:
                    self._idle.append(warm)
            if closed:  # stopped while this one started
                self.launcher.stop_warm(warm)
                return
            self.started += 1
            event(log, "warm.started", "warm runner %s started", warm.ident, worker=warm.ident,
                  pid=warm.meta.get("pid"))  # fmt: skip

    def close(self) -> int:
        """Stop every idle warm runner and start no more (shutdown); answer how many were stopped."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for warm in idle:
            try:
                self.launcher.stop_warm(warm)
            except Exception:  # one that cannot be stopped must not keep the others running
                log.exception("launcher error while stopping a warm runner",
                              extra={"event": "warm.stop_failed", "worker": warm.ident})  # fmt: skip
        try:
            self.launcher.close_warm()
        except Exception:  # shutdown goes on: what it held exits with the coordinator
            log.exception("launcher error while closing its warm runners' means",
                          extra={"event": "warm.stop_failed", "worker": ""})  # fmt: skip
        return len(idle)

    def _forget(self, warm: WarmWorker, why: str) -> None:
        lines = self.launcher.warm_last_lines(warm)
        code = self.launcher.stop_warm(warm)
        self.died += 1
        lived = time.time() - warm.started_at
        if lived < MIN_LIFE:
            delay = self._backoff.failed()
            self._start_after = time.monotonic() + delay
        event(log, "warm.exited", "warm runner %s %s (exit code %s after %.1fs); replacing it", warm.ident, why,
              "unknown" if code is None else code, lived, level=logging.WARNING, worker=warm.ident, exit_code=code,
              seconds=round(lived, 3), last_lines=lines[-5:])  # fmt: skip
