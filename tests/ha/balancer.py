"""Debian's haproxy in front of the web processes: its configuration, its request log and its stats, read back.

The balancer is configured the way docs/high-availability.md recommends:
a health check on ``/readyz``, ``retry-on conn-failure empty-response`` with
``option redispatch 1`` (a request a dead backend refused, or accepted and
never answered, is sent again to the other one), and timeouts above the
longest long poll. One log line per request (raw, to haproxy's stdout, which
the supervisor keeps in ``logs/haproxy.log``) carries what the checks need:
when it was accepted, how long it took, its status, the server that answered,
the retries, the termination state (who ended it) and a crc32 of its
``Authorization`` header (which coordinator polled, without writing a token
to disk).
"""

from __future__ import annotations

import shutil
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.harness import Supervisor, port_open, wait_for
from tests.ports import free_port

# accept time (s.ms), total ms, status, backend/server, retries ("+" when redispatched), termination state,
# method, path, crc32 of the Authorization header.
LOG_FORMAT = "%Ts.%ms %Ta %ST %b/%s %rc %tsc %HM %HP %[capture.req.hdr(0)]"
# Longer than any request Gantry holds: a parked poll is at most GANTRY_POLL_MAX_WAIT (30 s).
SERVER_TIMEOUT = "60s"


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if Path(p).exists()), None)


def config(port: int, servers: dict[str, int], stats_socket: Path) -> str:
    lines = [
        "global",
        "    log stdout format raw local0",
        f"    stats socket {stats_socket} mode 600 level operator",
        "    maxconn 4000",
        "defaults",
        "    mode http",
        "    log global",
        "    timeout connect 2s",
        "    timeout client 60s",
        f"    timeout server {SERVER_TIMEOUT}",
        "    timeout http-request 10s",
        # /readyz reads PostgreSQL and Redis: on two busy cores it may take over a second, which must
        # not mark a live server DOWN (haproxy's default check timeout is the interval).
        "    timeout check 5s",
        "    timeout queue 10s",
        # A backend that refuses the connection or closes it without an answer (a crash) gets the
        # request again on another server. Every call a runner or coordinator makes is safe to send
        # twice (docs/high-availability.md); a request already answered in part is never retried.
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response",
        # A request is sent again only if haproxy still holds all of it: wait for a POST's whole body
        # (Gantry's are small) before passing it on, or a crash mid-call is a 502.
        "    option http-buffer-request",
        "frontend gantry",
        f"    bind 127.0.0.1:{port}",
        "    http-request capture req.hdr(Authorization),crc32 len 12",
        f'    log-format "{LOG_FORMAT}"',
        "    default_backend web",
        "backend web",
        # Parked polls are long-lived: leastconn spreads them evenly over the two processes.
        "    balance leastconn",
        "    option httpchk GET /readyz",
        "    http-check expect status 200",
        "    default-server inter 1s fall 3 rise 2",
        *(f"    server {name} 127.0.0.1:{p} check" for name, p in servers.items()),
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Request:
    """One line of the balancer's log."""

    start: float  # unix time it was accepted
    seconds: float  # until it ended
    status: int
    server: str  # the server that answered it last ("<NOSRV>" when none did)
    retries: int
    redispatched: bool
    termination: str  # haproxy's 4-letter state: "----" ended normally, "SH--" the server closed, ...
    method: str
    path: str
    auth_crc: str

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @property
    def by_balancer(self) -> bool:
        """haproxy answered (or cut) it itself, not a backend: the termination state names a failure."""
        return self.termination[:1] != "-"


def parse(line: str) -> Request | None:
    parts = line.split()
    if len(parts) < 8 or "/" not in parts[3]:
        return None
    try:
        start, total, status = float(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        return None
    retries = parts[4]
    crc = parts[8].strip("{}") if len(parts) > 8 else ""
    return Request(
        start=start, seconds=max(total, 0) / 1000, status=status, server=parts[3].split("/", 1)[1],
        retries=int(retries.lstrip("+") or 0), redispatched=retries.startswith("+"), termination=parts[5],
        method=parts[6], path=parts[7], auth_crc=crc,
    )  # fmt: skip


def auth_crc(header: str) -> str:
    """What haproxy's ``crc32`` converter logs for an ``Authorization`` header (zlib's CRC-32, in decimal)."""
    return str(zlib.crc32(header.encode()))


@dataclass
class Balancer:
    supervisor: Supervisor
    folder: Path
    servers: dict[str, int]
    port: int = 0

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stats_socket = self.folder / "haproxy.sock"
        self.config_file = self.folder / "haproxy.cfg"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = haproxy_binary()
        assert binary, "haproxy is not installed"
        self.config_file.write_text(config(self.port, self.servers, self.stats_socket))
        # -db: stay in the foreground, so the supervisor owns it and its stdout is the log.
        self.supervisor.start("haproxy", [binary, "-db", "-f", str(self.config_file)], {"PATH": "/usr/sbin:/usr/bin"})
        wait_for(lambda: port_open(self.port), 30, "haproxy to listen")

    def up(self, server: str) -> bool:
        """Whether haproxy has the server UP after a check that passed (a server starts UP unchecked)."""
        for row in self.stats():
            if row.get("svname") == server:
                return row.get("status", "").startswith("UP") and row.get("check_status") == "L7OK"
        return False

    def parked(self, min_age: int = 1) -> list[str]:
        """The servers holding a request open for ``min_age`` seconds or more (``show sess``: one stream per
        request): a parked long poll, as nothing else Gantry answers takes that long."""
        found = []
        for line in self.command("show sess").splitlines():
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            age = fields.get("age", "0s")
            if fields.get("be") == "web" and age.endswith("s") and age[:-1].isdigit() and int(age[:-1]) >= min_age:
                found.append(fields.get("srv", ""))
        return [server for server in found if server in self.servers]

    def command(self, command: str) -> str:
        """One command on haproxy's stats socket, its whole answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(command.encode() + b"\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return data.decode()

    def stats(self) -> list[dict[str, str]]:
        """``show stat``: one row per frontend, backend and server (haproxy's CSV)."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]

    def requests(self) -> list[Request]:
        log = self.supervisor.children["haproxy"].log
        found = []
        for line in log.read_text(errors="replace").splitlines():
            request = parse(line)
            if request is not None:
                found.append(request)
        return found
