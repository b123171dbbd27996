"""The local launcher's half of the fork server (the runner's half, and the protocol: runners/zygote.py).

:class:`Zygote` starts ``python -m runners.ephemeral --zygote zygote-<id>`` with
one end of a ``SOCK_SEQPACKET`` pair as its stdin, asks it for warm runners
(:meth:`Zygote.fork`: a claim pipe's read end and the log file go with the
request; the write end stays here) and hears when they end. A forked warm
runner is not the coordinator's child, so :class:`ForkedChild` stands in for
the ``Popen`` a fresh interpreter would have: alive while the zygote has not
reported its end and /proc still shows it (the same pid and start time: a
zygote that died reports nothing more), its exit code as the zygote reported
it, else unknown (the launcher then reads the runner's exit file, as for a
worker it re-attached to).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from gantry_wire import procfs
from gantry_wire.logsetup import event
from launchers.base import LaunchError

log = logging.getLogger("gantry.launcher.local")

PACKET_BYTES = 4096
# A fork answers in milliseconds; a zygote that is still importing takes its start-up first.
FORK_TIMEOUT = 10.0
STOP_WAIT = 2.0


class ForkedChild:
    """A warm runner forked by the zygote, watched as the launcher watches its own children."""

    def __init__(self, pid: int, start_ticks: int | None, stdin: BinaryIO, zygote: Zygote) -> None:
        self.pid = pid
        self.start_ticks = start_ticks
        self.stdin: BinaryIO | None = stdin
        self.zygote = zygote
        self.returncode: int | None = None
        self.gone = False  # ended, whether or not its code is known

    def alive(self) -> bool:
        if self.gone:
            return False
        code = self.zygote.take_exit(self.pid)
        if code is not None:
            self.returncode, self.gone = code, True
            return False
        if not procfs.running(self.pid) or procfs.start_ticks(self.pid) not in (None, self.start_ticks):
            self.gone = True  # ended while no zygote watched it: its code is in its exit file, if anywhere
            return False
        return True

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code once it has ended (None when no zygote saw it end); ``subprocess.TimeoutExpired`` after
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.alive():
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"warm runner {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return self.returncode


class Zygote:
    """One ``runners.ephemeral --zygote`` process and its channel; thread-safe."""

    def __init__(self, argv: list[str], *, cwd: Path, env: Mapping[str, str], logs_dir: Path,
                 on_exit: Callable[[], None]) -> None:  # fmt: skip
        self.name = f"zygote-{uuid.uuid4().hex[:12]}"
        self.log_path = logs_dir / f"{self.name}.log"
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._exits_lock = threading.Lock()
        self._closed = threading.Event()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        try:
            with open(self.log_path, "ab") as output:
                self.proc = subprocess.Popen(
                    [*argv, "--zygote", self.name], cwd=cwd, env=dict(env), stdin=theirs.fileno(), stdout=output,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                )  # fmt: skip
        except OSError as exc:
            ours.close()
            permanent = isinstance(exc, (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError))
            raise LaunchError(f"cannot start the warm runners' zygote: {exc}", permanent=permanent) from exc
        finally:
            theirs.close()
        threading.Thread(target=self._read, name=f"{self.name}-reader", daemon=True).start()

    def alive(self) -> bool:
        return not self._closed.is_set() and self.proc.poll() is None

    def fork(self, warm_id: str, log_path: Path) -> ForkedChild:
        """A new warm runner named ``warm_id``, its output appended to ``log_path``; :class:`LaunchError` if not."""
        with self._lock:  # one request at a time, so each answer is the last request's
            read_end, write_end = os.pipe()
            try:
                log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as exc:
                os.close(read_end)
                os.close(write_end)
                raise LaunchError(f"cannot open {log_path}: {exc}") from exc
            try:
                socket.send_fds(self._sock, [json.dumps({"fork": warm_id}).encode()], [read_end, log_fd])
            except OSError as exc:
                os.close(write_end)
                raise LaunchError(f"the zygote {self.name} is gone: {exc}") from exc
            finally:
                os.close(read_end)
                os.close(log_fd)
            try:
                reply = self._replies.get(timeout=FORK_TIMEOUT)
            except queue.Empty:
                reply = {"refused": warm_id, "error": f"no answer within {FORK_TIMEOUT:.0f}s"}
                self.stop()  # its answers can no longer be matched to requests: start afresh
            if reply.get("forked") != warm_id or not isinstance(reply.get("pid"), int):
                os.close(write_end)
                raise LaunchError(f"the zygote {self.name} forked no warm runner: {reply.get('error', reply)}")
            pid = int(reply["pid"])
            return ForkedChild(pid, procfs.start_ticks(pid), os.fdopen(write_end, "wb"), self)

    def take_exit(self, pid: int) -> int | None:
        """The exit code the zygote reported for ``pid`` (each is taken once)."""
        with self._exits_lock:
            return self._exits.pop(pid, None)

    def stop(self) -> None:
        """End the zygote (its children go on: they are sessions of their own) and remove its log."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._sock.close()
        self.log_path.unlink(missing_ok=True)

    def last_lines(self, limit: int = 5) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-limit:]
        except OSError:
            return []

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(PACKET_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            try:
                message = json.loads(data)
            except ValueError:
                continue
            if "exited" in message:
                with self._exits_lock:
                    self._exits[int(message["exited"])] = int(message.get("code", -1))
                self._on_exit()
            else:
                self._replies.put(message)
        if not self._closed.is_set():
            event(log, "warm.zygote_exited", "the warm runners' zygote %s ended: %s", self.name,
                  " | ".join(self.last_lines()) or "no output", level=logging.WARNING, zygote=self.name)  # fmt: skip
        self._closed.set()
        self._replies.put({"error": "the zygote ended"})
        self._on_exit()  # its children may have ended unreported: look again through /proc
