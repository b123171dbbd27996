"""Ephemeral runner start-up: process start → its ``ready`` call, p50/p90 over N runs, before and after.

    .venv/bin/python -m tests.bench.runner_start [--runs 30] [--before REF]

"after" is this checkout's runners/ and gantry_wire/; "before" is the same two
folders at git REF (default ``main``), extracted to a temporary folder. Each
run starts ``python -m runners.ephemeral`` the way the local launcher does
(argv, environment, PYTHONPATH, byte code cached) against a small HTTP server
of this benchmark's own that stamps the moment the ready request has arrived,
answers it 204, then answers accept 409 ``run_already_terminal`` (the runner
deregisters and exits 0). The figure is therefore the runner's own start-up:
interpreter, imports, argument parsing, connecting and sending ready; a real
Gantry's handling of ready comes on top of it (a few ms, docs/performance.md).
The two variants alternate run by run, so load on a shared host hits both.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class ReadyServer:
    """Answers ready 204, accept 409 run_already_terminal, anything else 204; stamps each ready's arrival."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.ready_at: dict[str, float] = {}
        self.arrived = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                head = conn.recv(65536).decode("latin-1")
                path = head.split(" ", 2)[1] if " " in head else ""
                if path.endswith("/ready"):
                    with self.arrived:
                        self.ready_at[path.split("/")[4]] = time.perf_counter()
                        self.arrived.notify_all()
                if path.endswith("/accept"):
                    body = b'{"code": "run_already_terminal", "detail": "benchmark"}'
                    conn.sendall(b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                else:
                    conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")


def start_once(server: ReadyServer, code_root: Path, runner_id: str, work: Path) -> float:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update({
        "PYTHONPATH": str(code_root), "PYTHONUNBUFFERED": "1", "GANTRY_SERVER": server.url,
        "GANTRY_RUNNER_ID": runner_id, "GANTRY_RUNNER_TOKEN": "bench", "GANTRY_WORK_DIR": str(work),
        "GANTRY_LAUNCHER": "local",
    })  # fmt: skip
    argv = [sys.executable, "-m", "runners.ephemeral", "--run-id", runner_id, "--launcher", "local"]
    began = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=code_root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)  # fmt: skip
    if proc.wait(60) != 0:
        raise SystemExit(f"the runner in {code_root} exited with {proc.returncode}")
    with server.arrived:
        server.arrived.wait_for(lambda: runner_id in server.ready_at, timeout=10)
    return (server.ready_at[runner_id] - began) * 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--before", default="main", help="git ref of the 'before' code (default main)")
    args = parser.parse_args()
    server = ReadyServer()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", args.before, "runners", "gantry_wire"], cwd=ROOT,
                                 check=True, capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        variants = {"before": before, "after": ROOT}
        figures: dict[str, list[float]] = {name: [] for name in variants}
        # The byte code is written by a first start (as a launcher's runners do: only the first pays compiling).
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        for name, root in variants.items():
            start_once(server, root, f"warm-{name}", Path(tmp))
        for i in range(args.runs):
            for name, root in variants.items():
                figures[name].append(start_once(server, root, f"{name}-{i}", Path(tmp)))
        bare = []
        for _ in range(args.runs):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            bare.append((time.perf_counter() - began) * 1000)
    print(f"runner process start -> ready arrives, {args.runs} runs each, ms ({os.cpu_count()} cores)")
    print(f"{'':24s} {'p50':>7s} {'p90':>7s}")
    for name, values in figures.items():
        label = f"{name} ({args.before})" if name == "before" else name
        print(f"{label:24s} {statistics.median(values):7.1f} {percentile(values, 0.9):7.1f}")
    print(f"{'bare python -c pass':24s} {statistics.median(bare):7.1f} {percentile(bare, 0.9):7.1f}")


if __name__ == "__main__":
    main()
