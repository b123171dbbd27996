"""The modules an ephemeral runner loads before its ``ready`` call stay within an allow-list (docs/runners.md).

Why a list and not a stopwatch: a runner's start-up is dominated by imports
(issue 26: 105 of 125-175 ms were ``import runners.ephemeral``), and what is
imported is deterministic where a time on a shared 2-core host is not. So the
test starts a real runner under ``python -X importtime`` against a server of
its own; when ``ready`` arrives, every import before it has been written to
the runner's stderr (importtime writes unbuffered, before the request is
sent), so the server reads that stderr before answering. A module outside the
list fails the test: import it after ``ready`` (where it is used), or, if it
truly belongs on the path to ``ready``, add it here knowing it costs every
run's start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Loaded before ready beyond what a bare interpreter loads. argparse (with re and gettext), logging (with
# traceback, string, weakref, threading), socket, json, datetime (the JSON log line) and pathlib are the
# runner's own needs; everything else (the step supervisor, the log buffer, masking, gzip, hashlib,
# subprocess, tempfile, http.client, ssl, dataclasses, inspect, typing) comes after ready.
ALLOWED = frozenset(
    [
        "__future__",
        "types",
        "_operator",
        "operator",
        "itertools",
        "keyword",
        "reprlib",
        "_collections",
        "collections",
        "_functools",
        "functools",
        "enum",
        "_sre",
        "re._constants",
        "re._parser",
        "re._casefix",
        "re._compiler",
        "copyreg",
        "re",
        "warnings",
        "gettext",
        "argparse",
        "contextlib",
        "collections.abc",
        "token",
        "tokenize",
        "linecache",
        "textwrap",
        "traceback",
        "_weakrefset",
        "weakref",
        "_string",
        "string",
        "threading",
        "atexit",
        "logging",
        "_socket",
        "math",
        "select",
        "selectors",
        "errno",
        "array",
        "socket",
        "fnmatch",
        "_winapi",
        "nt",
        "ntpath",
        "urllib",
        "ipaddress",
        "urllib.parse",
        "pathlib",
        "_json",
        "json.scanner",
        "json.decoder",
        "json.encoder",
        "json",
        "_datetime",
        "datetime",
        "gantry_wire",
        "gantry_wire.logsetup",
        "gantry_wire.protocol",
        "gantry_wire.record",
        "runners",
        "runners.cli",
        "runners.client",
        "runners.ephemeral",
        "_locale",
        "locale",
        # argparse's help formatter asks shutil for the terminal width, even when no help is printed.
        "zlib",
        "_compression",
        "_bz2",
        "bz2",
        "_lzma",
        "lzma",
        "shutil",
        "signal",  # the runner's SIGTERM handler, installed before ready
        # socket.getaddrinfo encodes the host name with the idna codec.
        "unicodedata",
        "stringprep",
        "encodings.idna",
        # -m runners.ephemeral: runpy's own.
        "warnings",
        "importlib",
        "importlib.machinery",
        "importlib._abc",
        "importlib.util",
        "runpy",
        "pwd",  # the home folder, looked up by the interpreter's start when HOME is unset (as in this test)
    ]
)
NEVER_BEFORE_READY = ("runners.steps", "runners.logbuf", "runners.masking", "http.client", "ssl", "dataclasses",
                      "inspect", "typing", "subprocess", "gzip", "tempfile", "hashlib", "random", "base64")  # fmt: skip


def imported(importtime: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in importtime.splitlines() if line.startswith("import time:")}


def bare_interpreter() -> set[str]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True)
    return imported(out.stderr)


def answer(conn: socket.socket, status: str, body: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode() if body else b""
    conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                 + data)  # fmt: skip


def test_a_runner_reaches_ready_having_imported_only_the_allowed_modules(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "GANTRY_SERVER": f"http://127.0.0.1:{listener.getsockname()[1]}",
        "GANTRY_RUNNER_ID": "7",
        "GANTRY_RUNNER_TOKEN": "not-a-real-token",
        "GANTRY_WORK_DIR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "runners.ephemeral", "--run-id", "42", "--launcher", "test"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    before_ready: list[str] = []
    paths: list[str] = []

    def serve() -> None:
        # ready (204), accept (409 run_already_terminal: the runner deregisters and exits 0), deregister (204).
        for _ in range(3):
            conn, _ = listener.accept()
            with conn:
                head = conn.recv(65536).decode("latin-1")
                path = head.split(" ", 2)[1]
                paths.append(path)
                if path.endswith("/ready"):
                    assert proc.stderr is not None
                    os.set_blocking(proc.stderr.fileno(), False)
                    before_ready.append((proc.stderr.read() or b"").decode())
                    os.set_blocking(proc.stderr.fileno(), True)
                    answer(conn, "204 No Content")
                elif path.endswith("/accept"):
                    answer(conn, "409 Conflict", {"code": "run_already_terminal", "detail": "cancelled"})
                else:
                    answer(conn, "204 No Content")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    server.join(60)  # a hang guard, not a figure
    _, rest = proc.communicate(timeout=60)
    listener.close()
    assert paths == ["/api/v1/runners/7/ready", "/api/v1/runs/42/accept", "/api/v1/runners/7/deregister"], rest
    assert proc.returncode == 0, rest.decode(errors="replace")[-2000:]

    loaded = imported(before_ready[0]) - bare_interpreter()
    assert "runners.client" in loaded  # the capture saw the runner's own imports
    assert not loaded & set(NEVER_BEFORE_READY), sorted(loaded & set(NEVER_BEFORE_READY))
    assert loaded <= ALLOWED, f"imported before ready, not on the allow-list: {sorted(loaded - ALLOWED)}"
