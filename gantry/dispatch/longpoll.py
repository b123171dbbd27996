"""Long poll: park a poll until a run may be claimable for its org, then retry the claim.

Each server process runs one listener thread holding one PostgreSQL connection
that ``LISTEN``s on ``gantry_claimable`` (sent by triggers, see migration 0004,
and by services for group and org changes). A notification bumps its org's
generation counter and wakes the parked polls of that org; each retries its
claim and re-parks if another poll won. A parked poll holds no database
connection (it hands its own back to the pool), only a thread, so a threaded
server (gunicorn ``gthread``) holds many of them cheaply.

A notification can be lost (listener reconnecting, server restart), so a
parked poll also re-checks every ``RECHECK_SECONDS``; and a poll reads the
generation *before* its claim attempt, so a notification that lands between a
failed claim and the wait is never missed.

When the server stops (gunicorn's SIGTERM, see gunicorn.conf.py),
:func:`begin_shutdown` wakes every parked poll: each answers at once (204 when
its last attempt found nothing) instead of holding the worker's graceful
shutdown for up to ``GANTRY_POLL_MAX_WAIT`` seconds, and later polls do not
park. The coordinator simply polls again, reaching a server that is up.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

import psycopg
from django.conf import settings
from django.db import connection, connections
from psycopg.conninfo import make_conninfo

from gantry.sql.claim import FOLLOW_CHANNEL, LISTEN, TRY_LEAD

log = logging.getLogger("gantry.longpoll")

# Upper bound on how late a lost notification can make a parked poll.
RECHECK_SECONDS = 5.0
# The leader hands a NOTIFY on to FOLLOW_CHANNEL when it has no parked poll of that org to wake.
# The advisory lock whose holder is the long-poll leader ("gantry-lp" in ASCII, as a bigint).
LEADER_LOCK = 0x67616E7472796C70

T = TypeVar("T")

# Set when this process's server is stopping: polls stop parking.
_shutting_down = threading.Event()


class ClaimableListener:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._cond = threading.Condition()
        self._generation: defaultdict[int, int] = defaultdict(int)
        self._epoch = 0  # bumped on reconnect: everyone re-checks
        self._total = 0  # every notification, of any org (the backend dispatcher waits on it)
        self._ready = threading.Event()
        self._stop = threading.Event()
        # Callbacks (org id, or None after a reconnect) run on this thread: the
        # ASGI poll hands each notification to its event loop (gantry.server.asyncpoll).
        self._subscribers: list[Callable[[int | None, bool], None]] = []
        # One listener per database holds LEADER_LOCK: its process's parked polls
        # are woken first; the others' only when a run is still claimable after
        # a short delay (gantry.server.asyncpoll), so one run costs one claim
        # attempt however many server processes hear its NOTIFY.
        self.leader = False
        self.wants_lead = False  # only a process with parked polls to wake competes (gantry.asgi)
        self._thread = threading.Thread(target=self._run, name="gantry-listen", daemon=True)
        self._thread.start()

    def generation(self, org_id: int) -> tuple[int, int]:
        with self._cond:
            return self._epoch, self._generation[org_id]

    def wait(self, org_id: int, seen: tuple[int, int], timeout: float) -> bool:
        """Wait until ``org_id`` may have new work since ``seen``, or the server stops; False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (self._epoch, self._generation[org_id]) != seen or _shutting_down.is_set(), timeout
            )

    def any_generation(self) -> tuple[int, int]:
        with self._cond:
            return self._epoch, self._total

    def wait_any(self, seen: tuple[int, int], timeout: float, stop: threading.Event | None = None) -> bool:
        """Wait until any org may have new work since ``seen`` (or ``stop`` is set); False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (self._epoch, self._total) != seen or (stop is not None and stop.is_set()), timeout
            )

    def subscribe(self, callback: Callable[[int | None, bool], None]) -> None:
        """Call ``callback(org_id, forwarded)`` for each notification, ``callback(None, False)`` when some may
        have been lost; ``forwarded``: the leader's hand-on on FOLLOW_CHANNEL."""
        # Sent before LISTEN is in place is lost: callback(None) follows every (re)connect.
        self._subscribers.append(callback)

    def _tell(self, org_id: int | None, forwarded: bool = False) -> None:
        for callback in list(self._subscribers):
            try:
                callback(org_id, forwarded)
            except Exception:
                log.exception("long-poll subscriber failed", extra={"event": "longpoll.subscriber_error"})

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_ready(self, timeout: float) -> bool:
        """True once LISTEN is in place (tests use it to avoid racing the first notification)."""
        return self._ready.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening and drop the connection (tests: a database cannot be dropped while we hold one)."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    conn.execute(LISTEN)
                    with self._cond:
                        # Anything sent while we were not listening is lost: wake all.
                        self._epoch += 1
                        self._cond.notify_all()
                    self._ready.set()
                    self._tell(None)
                    backoff = 0.5
                    while not self._stop.is_set():
                        if self.wants_lead and not self.leader:
                            # Held as long as this session lives: when the leader's
                            # process goes, another listener takes it within a second.
                            row = conn.execute(TRY_LEAD, [LEADER_LOCK]).fetchone()
                            self.leader = bool(row and row[0])
                        # A bounded wait only so close() is noticed; notifications
                        # arriving between two calls are kept by the connection.
                        for note in conn.notifies(timeout=1.0):
                            self._wake(note.payload, forwarded=note.channel == FOLLOW_CHANNEL)
            except psycopg.OperationalError as exc:
                self.leader = False  # the session, and with it the lock, is gone
                # The database restarted or is out of reach: expected, and said
                # in one line (no traceback); parked polls fall back to their
                # periodic re-check, and all of them re-check on reconnect.
                self._ready.clear()
                log.warning("long-poll listener lost its connection; reconnecting: %s", exc,
                            extra={"event": "longpoll.listener_reconnect"})  # fmt: skip
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:
                self.leader = False
                self._ready.clear()
                log.exception("long-poll listener failed; restarting it", extra={"event": "longpoll.listener_error"})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        self._ready.clear()

    def _wake(self, payload: str, forwarded: bool = False) -> None:
        try:
            org_id = int(payload)
        except ValueError:
            return
        if forwarded:
            self._tell(org_id, forwarded=True)  # not new work: the same NOTIFY, handed on by the leader
            return
        with self._cond:
            self._generation[org_id] += 1
            self._total += 1
            self._cond.notify_all()
        self._tell(org_id)


_listener: ClaimableListener | None = None
_listener_lock = threading.Lock()


def _dsn() -> str:
    """The database Django's connection really uses, not just the one DATABASE_URL names.

    NOTIFY reaches only listeners on the same database. Under tests Django points
    the connection at the test database while DATABASE_URL still names the
    configured one: LISTENing there heard nothing, and every parked poll waited
    for its periodic re-check instead of waking.
    """
    return make_conninfo(settings.DATABASE_URL, dbname=connections["default"].settings_dict["NAME"])


def listener() -> ClaimableListener:
    global _listener
    with _listener_lock:
        if _listener is None:
            _listener = ClaimableListener(_dsn())
        return _listener


def stop_listener() -> None:
    """Stop this process's listener, if it runs, and forget a shutdown; the next long poll starts afresh."""
    global _listener
    with _listener_lock:
        if _listener is not None:
            _listener.close()
            _listener = None
        _shutting_down.clear()


# Called by begin_shutdown (in a signal handler: each must take no lock); the ASGI hub adds one.
_shutdown_hooks: list[Callable[[], None]] = []


def on_shutdown(hook: Callable[[], None]) -> None:
    _shutdown_hooks.append(hook)


def shutting_down() -> bool:
    return _shutting_down.is_set()


def begin_shutdown() -> None:
    """The server is stopping: parked polls answer now, and new polls do not park."""
    _shutting_down.set()
    for hook in list(_shutdown_hooks):
        hook()
    # No _listener_lock: this runs in a signal handler, which must never wait
    # on a lock its own thread may hold. Reading the reference is atomic.
    current = _listener
    if current is not None:
        current.wake_all()


def wake_listener() -> None:
    """Wake everyone waiting on this process's listener (safe in a signal handler: no lock is taken)."""
    current = _listener
    if current is not None:
        current.wake_all()


def shutdown_on(signum: int) -> None:
    """Call :func:`begin_shutdown` when ``signum`` arrives, then the handler that was there before.

    For a server's graceful-stop signal (gunicorn.conf.py installs it for
    SIGTERM in each worker): the server still drains its requests as before,
    only the parked polls no longer make it wait.
    """
    previous = signal.getsignal(signum)

    def handler(sig: int, frame: FrameType | None) -> None:
        begin_shutdown()
        if callable(previous):
            previous(sig, frame)
        elif previous == signal.SIG_DFL:
            # Nobody handled it before us: do what the default would (end the process).
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)

    signal.signal(signum, handler)


def wait_for_claim(*, org_id: int, wait: float, attempt: Callable[[], T | None]) -> T | None:
    """Call ``attempt`` now, and again whenever the org may have new work, until it
    returns something or ``wait`` seconds pass."""
    if wait <= 0 or _shutting_down.is_set():
        return attempt()
    deadline = time.monotonic() + wait
    lst = listener()
    while True:
        # Read the generation before the attempt: a notification that lands
        # after a failed attempt but before the wait still wakes us.
        seen = lst.generation(org_id)
        result = attempt()
        if result is not None:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0 or _shutting_down.is_set():
            return None
        # Hand the connection back to the pool while parked.
        connection.close()
        lst.wait(org_id, seen, min(remaining, RECHECK_SECONDS))
