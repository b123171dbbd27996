"""The kick: a thread of the Celery worker that LISTENs to the outbox's channel and queues a delivery task.

Migration 0022's trigger NOTIFYs ``gantry_webhooks`` for each outbox row;
PostgreSQL sends a NOTIFY only when its transaction commits and folds a
transaction's identical ones, so each committed transition that wrote
deliveries queues about one task, after its commit, whichever process (web,
fast lane, reaper) made it. Notifications that arrive together are folded
into one kick. A lost connection is re-opened after a pause, and a kick is
sent then (anything committed meanwhile is due); beat's tick covers the gap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import kombu.exceptions
import psycopg
import redis

from gantry.dispatch.longpoll import _dsn

log = logging.getLogger(__name__)

CHANNEL = "gantry_webhooks"
RECONNECT_PAUSE = 2.0
_started = threading.Event()


def _kick_quietly(kick: Callable[[], object]) -> None:
    # The kick queues a Celery task through the broker (Redis): during a broker
    # outage it fails, and beat's tick sends what is due once it is back. An
    # outage is expected weather, said in one line; a bug still logs its traceback.
    try:
        kick()
    except (OSError, kombu.exceptions.KombuError, kombu.exceptions.OperationalError, redis.RedisError) as exc:
        log.warning("webhook kick not queued: %r", exc, extra={"event": "webhooks.kick_failed"})


def listen(kick: Callable[[], object], stop: threading.Event) -> None:
    """Call ``kick`` once per batch of NOTIFYs on :data:`CHANNEL` until ``stop`` is set."""
    while not stop.is_set():
        try:
            with psycopg.connect(_dsn(), autocommit=True) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                _kick_quietly(kick)  # whatever committed while nobody listened
                while not stop.is_set():
                    if any(True for _ in conn.notifies(timeout=1.0, stop_after=1)):
                        # Fold the notifications that came with it into this one kick.
                        for _ in conn.notifies(timeout=0.05):
                            pass
                        _kick_quietly(kick)
        except psycopg.Error as exc:
            # The database restarting or unreachable: expected, one line, and try again.
            log.warning(
                "webhook listener lost its connection; reconnecting: %r", exc, extra={"event": "webhooks.listen_lost"}
            )
            stop.wait(RECONNECT_PAUSE)
        except Exception:
            log.exception("webhook listener failed; restarting it")
            stop.wait(RECONNECT_PAUSE)


def start(kick: Callable[[], object]) -> threading.Event | None:
    """Start the listener thread once per process; its stop event (None when already started)."""
    if _started.is_set():
        return None
    _started.set()
    stop = threading.Event()
    threading.Thread(target=listen, args=(kick, stop), name="webhook-listener", daemon=True).start()
    return stop
