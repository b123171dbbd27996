"""Reading processes from /proc (Linux), for the runner, the local launcher and ``dev.py``.

Standard library only (``dev.py`` runs before anything is installed). Every
helper degrades where /proc is missing: it answers what ``kill(pid, 0)`` can
tell, or None.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

# Index of each field of /proc/<pid>/stat after the command name (field 3 onwards).
STATE, PPID, PGRP, SESSION = 0, 1, 2, 3
START_TIME = 19  # field 22: clock ticks after boot


def stat_fields(pid: int) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks after boot: with the pid, it names one process for ever."""
    fields = stat_fields(pid)
    return int(fields[START_TIME]) if fields and len(fields) > START_TIME else None


def cmdline(pid: int) -> list[bytes]:
    """The process's argv (empty when unreadable)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has exited; only its parent's wait is missing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = stat_fields(pid)
    if fields is None:
        return not Path("/proc").is_dir()  # no /proc (not Linux): trust kill(0)
    return fields[STATE] != b"Z"


def members(field: int, value: int) -> list[int]:
    """Live (non-zombie) processes whose stat ``field`` (PGRP or SESSION) equals ``value``; empty without /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields and len(fields) > field and int(fields[field]) == value and fields[STATE] != b"Z":
            found.append(int(entry))
    return found


def has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def kill_session(sid: int, *, leader_is_zombie: bool) -> int:
    """SIGKILL every process left in session ``sid`` (a dead runner's steps); answer how many.

    A session id is its leader's pid. While any process remains in the session
    the kernel keeps that pid reserved, so members found here are truly the
    runner's. If a process *with* that pid is running (and it is not our
    unreaped worker), the pid was reused after the session emptied: nothing
    here is ours, leave it alone.
    """
    if not leader_is_zombie:
        try:
            os.kill(sid, 0)
            return 0
        except ProcessLookupError:
            pass
        except PermissionError:
            return 0
    killed = 0
    for pid in members(SESSION, sid):
        if pid == sid:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
