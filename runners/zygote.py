"""The fork server behind the local launcher's warm runners (docs/runners.md, "Warm runners").

A warm runner started as a fresh interpreter pays its interpreter and its
imports (about 50 ms of CPU) when it is started, and a burst spends that
again for every replacement. The zygote pays it once: ``python -m
runners.ephemeral --zygote NAME`` imports what a run needs, freezes what it
holds (``gc.freeze``, so the children's collections do not copy its pages),
and then forks one warm runner per request, in about a millisecond.

It talks to the launcher (launchers/local.py, ``Zygote``) over its stdin, one
end of a ``SOCK_SEQPACKET`` Unix socket pair: one JSON message per packet.

- launcher -> zygote: ``{"fork": WARM_ID}`` carrying two descriptors
  (``SCM_RIGHTS``): the read end of the claim pipe and the log file. The
  child becomes a session leader (its steps' processes are its session, as a
  cold runner's), takes the pipe as its stdin and the log as its stdout and
  stderr, and is then exactly ``runners.ephemeral --warm WARM_ID``: it waits
  for its claim on the pipe, holding no run and no credential.
- zygote -> launcher: ``{"forked": WARM_ID, "pid": P}`` or ``{"refused":
  WARM_ID, "error": "..."}``; and ``{"exited": P, "code": C}`` when a child
  ends (``C`` as ``subprocess`` gives it: negative for a signal). Before the
  zygote reaps a child it kills what the child left in its session (a killed
  runner's steps), while the zombie still holds the session's id.

The zygote holds nothing of a run either: the claim goes down the pipe
straight to the child. At end-of-file on its stdin (the coordinator stopped or
died) it exits; its children are in sessions of their own and go on (the
local launcher's records re-attach the busy ones; an idle one reads
end-of-file on its pipe, whose other end the coordinator held, and exits 0).

Single-threaded on purpose: a process with threads cannot fork safely.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
from typing import Any

from gantry_wire import procfs

# A request is a few dozen bytes; a packet is never near this.
PACKET_BYTES = 4096
EXIT_INTERNAL = 70


def serve(argv_tail: list[str]) -> int:
    """Preload, then fork warm runners on request until end-of-file on stdin; the zygote's exit code."""
    from runners import warm

    for module in (*warm.PRELOAD, "runners.ephemeral"):
        importlib.import_module(module)
    control = socket.socket(fileno=os.dup(0))
    _to_devnull(0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    # A handler (not SIG_DFL) so the wakeup fd hears of every child's end; the loop reaps.
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    # Everything imported so far lives as long as the zygote: out of the collector's sight, so
    # a child's collections never write to (and so copy) the pages it shares with the zygote.
    gc.freeze()
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([control.fileno(), wake_r], [], [])
            if wake_r in readable:
                os.read(wake_r, 4096)
                _reap(control, children)
            if control.fileno() in readable:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(control, PACKET_BYTES, 2)
                except OSError:
                    return 0
                if not data:
                    return 0  # the launcher is gone
                child = _fork(control, data, fds, (wake_r, wake_w), argv_tail)
                if child:
                    children.add(child)
    finally:
        _reap(control, children)


def _fork(control: socket.socket, data: bytes, fds: list[int], close: tuple[int, ...], argv_tail: list[str]) -> int:
    """Fork the warm runner one request asks for; its pid (0 when refused). Never returns in the child."""
    try:
        warm_id = str(json.loads(data)["fork"])
    except (ValueError, KeyError, TypeError):
        warm_id = ""
    if not warm_id or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        _send(control, {"refused": warm_id, "error": 'a fork request is {"fork": ID} with two descriptors'})
        return 0
    claim_fd, log_fd = fds
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(claim_fd)
        os.close(log_fd)
        _send(control, {"refused": warm_id, "error": f"fork failed: {exc}"})
        return 0
    if pid == 0:
        _child(control, claim_fd, log_fd, close, warm_id, argv_tail)
    os.close(claim_fd)
    os.close(log_fd)
    _send(control, {"forked": warm_id, "pid": pid})
    return pid


def _child(control: socket.socket, claim_fd: int, log_fd: int, close: tuple[int, ...], warm_id: str,
           argv_tail: list[str]) -> None:  # fmt: skip
    """In the forked child: become a warm runner of its own session; never returns."""
    code = EXIT_INTERNAL
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(claim_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (claim_fd, log_fd, *close):
            os.close(fd)
        control.close()  # the child's copy: the zygote's channel is not the runner's business
        from runners import ephemeral

        code = ephemeral.main(["--warm", warm_id, *argv_tail])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the child must end here, never back in the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # exiting either way
                stream.flush()
        os._exit(code)


def _reap(control: socket.socket, children: set[int]) -> None:
    """Report and reap every child that has ended, after killing what it left in its session."""
    for pid in list(children):
        try:
            # WNOWAIT: the zombie keeps the pid, so the session's id, until its leftovers are killed.
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                continue
        except ChildProcessError:
            children.discard(pid)
            continue
        procfs.kill_session(pid, leader_is_zombie=True)
        _, status = os.waitpid(pid, 0)
        children.discard(pid)
        _send(control, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(control: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the launcher is gone: the loop sees end-of-file next
        control.send(json.dumps(message).encode())


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
