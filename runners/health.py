"""The coordinator's own health and metrics: ``--health-addr HOST:PORT`` (docs/runners.md, "Health and metrics").

``GET /healthz`` answers 200 while the coordinator's loops are alive and its
last successful answer from Gantry is recent, else 503 with the reason: a
Kubernetes liveness and readiness probe. ``GET /metrics`` is Prometheus
text of its own counters.

Standard library only, like the rest of the runner side (its image installs
nothing else): the server is ``http.server.ThreadingHTTPServer`` on a daemon
thread, and the few lines of the text exposition format are written here.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Every label value each counter can take, so each series exists (at 0) before its first event:
# a rate() over a series that appears with its first failure misses that failure.
POLL_OUTCOMES = ("assigned", "empty", "error", "unauthorized")
# permanent: the launcher said it can never work; retries_exhausted: transient failures until the
# attempts ran out; launcher_error: the launcher raised something it should not have (a bug);
# startup: the worker started but died before taking its run (reported by the reconciler).
FAILURE_REASONS = ("permanent", "retries_exhausted", "launcher_error", "startup")


@dataclass(frozen=True)
class Verdict:
    """What ``/healthz`` says: healthy or not, why not, and the figures it judged by."""

    ok: bool
    reason: str
    details: Mapping[str, object]


class CoordinatorMetrics:
    """The coordinator's counters, safe to update from its poll loop, its reconciler and its launches at once."""

    def __init__(self, launcher: str) -> None:
        self._lock = threading.Lock()
        self.launcher = launcher
        self.launches = 0
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.polls = dict.fromkeys(POLL_OUTCOMES, 0)

    def launched(self) -> None:
        with self._lock:
            self.launches += 1

    def launch_failed(self, reason: str) -> None:
        with self._lock:
            self.failures[reason] += 1

    def polled(self, outcome: str) -> None:
        with self._lock:
            self.polls[outcome] += 1

    def exposition(self, *, workers: int, last_contact: float | None, warm: int = 0) -> str:
        """The Prometheus text exposition format (version 0.0.4) of every series."""
        with self._lock:
            launches, failures, polls = self.launches, dict(self.failures), dict(self.polls)
        lines: list[str] = []
        _family(lines, "gantry_coordinator_workers_running", "gauge", "Workers this coordinator runs now.",
                [({}, workers)])  # fmt: skip
        _family(lines, "gantry_coordinator_workers_warm", "gauge",
                "Warm runners waiting for a claim (--warm), not counted in workers_running.", [({}, warm)])  # fmt: skip
        _family(lines, "gantry_coordinator_launches_total", "counter", "Workers launched, by launcher kind.",
                [({"launcher": self.launcher}, launches)])  # fmt: skip
        _family(lines, "gantry_coordinator_launch_failures_total", "counter",
                "Claimed runs reported as dispatch-failed, by reason.",
                [({"reason": r}, n) for r, n in failures.items()])  # fmt: skip
        _family(lines, "gantry_coordinator_polls_total", "counter", "Polls for a run, by outcome.",
                [({"outcome": o}, n) for o, n in polls.items()])  # fmt: skip
        if last_contact is not None:
            # Absent (rather than 0, "1970") until the first successful answer.
            _family(lines, "gantry_coordinator_last_contact_timestamp_seconds", "gauge",
                    "Unix time of the last successful answer from Gantry.", [({}, last_contact)])  # fmt: skip
        return "\n".join(lines) + "\n"


def _family(lines: list[str], name: str, kind: str, help_text: str,
            samples: Iterable[tuple[Mapping[str, str], float]]) -> None:  # fmt: skip
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        # Label values here are launcher kinds and fixed words: nothing to escape but the rules say how.
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {float(value)!r}" if text else f"{name} {float(value)!r}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def parse_addr(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8081`` for IPv6) as (host, port); ValueError with the reason otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--health-addr takes HOST:PORT (0.0.0.0:8081, 127.0.0.1:8081, [::]:8081), not {value!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


class HealthServer:
    """``/healthz`` and ``/metrics`` on ``addr``, answered from a daemon thread by ``verdict`` and ``metrics_text``."""

    def __init__(self, addr: tuple[str, int], verdict: Callable[[], Verdict], metrics_text: Callable[[], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    found = verdict()
                    body = {"status": "ok" if found.ok else "unhealthy", "reason": found.reason, **found.details}
                    self._answer(200 if found.ok else 503, "application/json", json.dumps(body).encode())
                elif path == "/metrics":
                    self._answer(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text().encode())
                else:
                    self._answer(404, "application/json", b'{"status": "not found"}')

            def _answer(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                # A probe every few seconds would flood the coordinator's JSON log.
                del format, args

        self.server = _server_class(addr[0])(addr, Handler)
        self.server.daemon_threads = True
        host, port = self.server.server_address[:2]
        # The port actually bound (":0" asks for any free one: tests).
        self.address: tuple[str, int] = (host if isinstance(host, str) else host.decode(), int(port))
        self._thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    """ThreadingHTTPServer for an IPv4 host, or a subclass bound to IPv6 when ``host`` has a colon."""
    if ":" not in host:
        return ThreadingHTTPServer

    class V6(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    return V6


def judge(*, loops: Mapping[str, bool], last_contact: float | None, started: float, stale_after: float,
          now: float | None = None) -> Verdict:  # fmt: skip
    """Healthy when every loop is alive and Gantry answered within ``stale_after`` seconds (or since the start).

    Before the first answer the start counts as one: a coordinator whose server
    is still starting (normal in Kubernetes) is healthy for ``stale_after``.
    """
    now = time.time() if now is None else now
    reference = max(last_contact or 0.0, started)
    since = now - reference
    details: dict[str, object] = {
        "loops": dict(loops),
        "last_contact": last_contact,
        "seconds_since_contact": round(since, 3),
        "stale_after": stale_after,
    }
    dead = [name for name, alive in loops.items() if not alive]
    if dead:
        return Verdict(False, f"loop stopped: {', '.join(dead)}", details)
    if since > stale_after:
        what = "no successful answer from Gantry" if last_contact is None else "last successful answer from Gantry"
        return Verdict(False, f"{what} for {since:.0f}s (bound {stale_after:g}s)", details)
    return Verdict(True, "ok", details)
