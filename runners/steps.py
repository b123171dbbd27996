"""Running one step: a shell command in its own process group, its output into the run's log, stopped on demand.

The ephemeral runner (``runners.ephemeral``) decides *whether* a step should
stop (cancelled, timed out, the runner told to stop, the run lost); this module
does the process work: start ``bash -c <run>`` in a process group of its own,
pump its merged stdout and stderr into the log in large blocks, wait for it
without reaping it early, and stop the whole group (SIGTERM, then SIGKILL
after the grace period) — including whatever the step left running.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from gantry_wire import procfs
from gantry_wire.logsetup import event
from runners.masking import SecretMasker

log = logging.getLogger("gantry.runner")

# The shell's convention for "killed by timeout" (coreutils timeout(1)).
EXIT_TIMEOUT = 124
# The shell's convention for "command found but cannot be executed" (exec failed: E2BIG, ENOEXEC, ...).
EXIT_CANNOT_EXECUTE = 126
READ_BLOCK = 1 << 20
# How the log explains why a step is being stopped.
STOP_WORDS = {
    "lost": "the run ended on the server without this runner",
    "stopped": "the runner was told to stop (SIGTERM)",
}


class Sink(Protocol):
    def write(self, data: bytes) -> None: ...


class StepLog:
    """The run's log as the steps see it: their raw output (masked), and the runner's own notice lines between.

    Step output goes through ``masker`` (the stack's secrets become ``***``)
    before it reaches the log buffer; notices are the runner's own words and
    go straight in, after whatever the masker still held. It remembers the last
    byte written, so a notice always starts on a line of its own even after
    output that did not end with a newline.
    """

    def __init__(self, sink: Sink, masker: SecretMasker | None = None) -> None:
        self.sink = sink
        self.masker = masker or SecretMasker((), sink.write)
        self._last_byte = b"\n"

    def output(self, data: bytes) -> None:
        if data:
            self._last_byte = data[-1:]
            self.masker.write(data)

    def notice(self, line: bytes) -> None:
        """A line of the runner's own (headers, footers, notices), on a line of its own."""
        self.flush()
        if self._last_byte != b"\n":
            line = b"\n" + line
        self._last_byte = line[-1:]
        self.sink.write(line)

    def flush(self) -> None:
        """Everything the steps wrote is in the log (the masker's held tail included)."""
        self.masker.flush()


class StepStartFailed(Exception):
    """The step's shell could not be started at all (``exec`` failed: its environment or command line is too
    big, no shell, no memory). The run fails with this reason instead of the runner crashing."""


class StepSupervisor:
    """Runs steps one at a time for one run.

    ``reason_to_stop(deadline)`` answers why the current step must stop now
    (``cancelled``, ``timed out``, ``stopped``, ``lost``) or None; ``wake`` is
    set by whoever changes that answer, so the wait loop looks again at once.
    ``on_stopping(reason)`` runs once the group has been sent SIGTERM (the
    runner acknowledges a cancellation there).
    """

    def __init__(
        self,
        *,
        steplog: StepLog,
        run_id: str,
        grace: float,
        wake: threading.Event,
        reason_to_stop: Callable[[float], str | None],
        on_stopping: Callable[[str], None],
    ) -> None:
        self.steplog = steplog
        self.run_id = run_id
        self.grace = grace
        self.wake = wake
        self.reason_to_stop = reason_to_stop
        self.on_stopping = on_stopping

    def run(self, command: str, env: dict[str, str], work: Path, deadline: float) -> tuple[int, str]:
        """Run one step; answer (exit code, why it ended: exited | cancelled | timed out | stopped | lost)."""
        shell = shutil.which("bash") or "/bin/sh"
        try:
            proc = subprocess.Popen(
                [shell, "-c", command],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                # Its own process group (not a new session): signals reach the
                # whole step, and the step stays in the runner's session, where
                # the local launcher can sweep it up if the runner is killed.
                process_group=0,
                close_fds=True,
            )
        except OSError as exc:
            # E2BIG (a command line or environment over the kernel's limit),
            # ENOENT (no shell), ENOMEM: the step never ran.
            raise StepStartFailed(f"the step could not be started: {exc.strerror or exc}") from exc
        assert proc.stdout is not None
        reader = threading.Thread(target=self._pump, args=(proc.stdout,), name="step-output", daemon=True)
        reader.start()
        exited = threading.Event()
        threading.Thread(target=self._await_exit, args=(proc.pid, exited), name="step-wait", daemon=True).start()
        why = "exited"
        while not exited.is_set():
            reason = self.reason_to_stop(deadline)
            if reason is not None:
                why = reason
                self._stop_group(proc.pid, reason)
                break
            self.wake.wait(min(0.5, max(0.01, deadline - time.monotonic())))
            self.wake.clear()
        # The step is over: whatever it left running in its group goes with it
        # (and releases the pipe, so the reader reaches end of file). The
        # leader is not reaped yet, so its pid, the group's id, cannot have
        # been reused by an unrelated process.
        killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        reader.join(timeout=10)
        if reader.is_alive():
            event(log, "step.output_open", "a process that left the step's group still holds its output; "
                  "its further output is ignored", level=logging.WARNING, run_id=self.run_id)  # fmt: skip
        else:
            proc.stdout.close()
        if why == "timed out":
            code = EXIT_TIMEOUT
        # A death by signal reads as a negative code: report it the shell's way.
        return (128 - code if code < 0 else code), why

    def _await_exit(self, pid: int, exited: threading.Event) -> None:
        """Block until the step's leader exits, without reaping it (WNOWAIT), then wake the main loop."""
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        exited.set()
        self.wake.set()

    def _pump(self, pipe: IO[bytes]) -> None:
        """Copy the step's output into the log in large blocks: no per-line work on this path."""
        fd = pipe.fileno()
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, READ_BLOCK)  # fewer, larger reads (Linux)
        try:
            while True:
                data = os.read(fd, READ_BLOCK)
                if not data:
                    return
                self.steplog.output(data)
        except (OSError, ValueError):
            return  # the pipe was closed under us, or the log is closed: the step is over

    def _stop_group(self, pgid: int, reason: str) -> None:
        """SIGTERM the step's process group; the caller SIGKILLs what is left after the grace period."""
        said = STOP_WORDS.get(reason, reason)
        self.steplog.notice(f"[gantry: {said}; stopping the step (SIGTERM, SIGKILL after {self.grace:g}s)]\n".encode())
        killpg(pgid, signal.SIGTERM)
        self.on_stopping(reason)
        limit = time.monotonic() + self.grace
        while time.monotonic() < limit and group_has_live_members(pgid):
            time.sleep(0.05)


def killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def group_has_live_members(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies waiting to be reaped do not count)."""
    if not procfs.has_proc():  # not Linux: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return bool(procfs.members(procfs.PGRP, pgid))
