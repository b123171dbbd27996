"""Log readers parked on the event loop: ``GET /api/v1/runs/{id}/logs?wait=`` under gantry.asgi (docs/logs.md).

A reader asks with ``wait``; when nothing past its offset exists yet and the
run is not final (the view says so by setting :class:`gantry.logs.live.Park`),
the answer is held here, on the event loop, with no thread and no database
connection, until the run's live record changes (a push, its deletion at
``/done``) or the wait ends; then the view is called again and its answer
sent. Both calls are the ordinary Django view (authentication, scoping, the
reader), so answers are those of the WSGI server.

Changes arrive by Redis pub/sub: every write of a live record PUBLISHes on the
run's channel in the same pipeline (gantry.logs.live.store, delete_many). One
subscriber connection per event loop (:class:`Watcher`) is subscribed to the
channels of the runs that have parked readers, and only those: a push nobody
follows reaches no web process.

The reader is subscribed *before* its first read, and the subscription is
confirmed by Redis before that read starts, so a push that lands between the
read and the park is not missed. When Redis is unavailable the wait is
skipped: the first answer goes out at once (the client asks again, as it
would without ``wait``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import redis
import redis.asyncio as aredis
from django.conf import settings
from prometheus_client import Gauge

from gantry.logs import live
from gantry.redis import CONNECT_TIMEOUT

log = logging.getLogger("gantry.logs")

PARKED = Gauge("gantry_log_readers_parked", "Log readers (GET /runs/{id}/logs?wait=) parked on this process's loop.")

# How long a subscription's confirmation may take before the reader is answered without waiting.
CONFIRM_SECONDS = 1.0
# The subscriber's read wakes this often even when nothing arrives (a cheap loop; it notices a closed loop).
READ_SECONDS = 5.0


class Unavailable(Exception):
    """Redis could not be subscribed to: answer without waiting."""


class Watcher:
    """One event loop's pub/sub connection and the readers parked on it, by channel. Loop thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str) -> None:
        self.loop = loop
        self._redis = aredis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT)
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._parked: dict[str, set[asyncio.Event]] = {}
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        # Subscribes one at a time: redis-py's PubSub connects lazily in each command, so readers
        # arriving together on a new pubsub would each open a connection of their own and all but
        # the last would subscribe where no one reads (their confirmations, and pushes, never seen).
        self._subscribing = asyncio.Lock()

    async def watch(self, run_id: uuid.UUID) -> asyncio.Event:
        """An event set when the run's live record changes, once Redis confirmed the subscription."""
        name = live.channel(run_id)
        changed = asyncio.Event()
        readers = self._parked.setdefault(name, set())
        readers.add(changed)
        try:
            if len(readers) == 1:
                self._confirmed[name] = self.loop.create_future()
                await asyncio.wait_for(self._subscribe(name), CONFIRM_SECONDS)
                if self._reader is None or self._reader.done():
                    self._reader = self.loop.create_task(self._read())
            await asyncio.wait_for(asyncio.shield(self._confirmed[name]), CONFIRM_SECONDS)
        except (redis.RedisError, OSError, TimeoutError, KeyError) as exc:
            self.unwatch(run_id, changed)
            raise Unavailable(str(exc)) from exc
        return changed

    async def _subscribe(self, name: str) -> None:
        async with self._subscribing:
            if self._pubsub is None:
                self._pubsub = self._redis.pubsub()
            await self._pubsub.subscribe(name)

    def unwatch(self, run_id: uuid.UUID, changed: asyncio.Event) -> None:
        name = live.channel(run_id)
        readers = self._parked.get(name)
        if readers is None:
            return
        readers.discard(changed)
        if not readers:
            del self._parked[name]
            confirmed = self._confirmed.pop(name, None)
            if confirmed is not None and not confirmed.done():
                confirmed.cancel()
            if self._pubsub is not None:
                self.loop.create_task(self._unsubscribe(name))

    async def _unsubscribe(self, name: str) -> None:
        if name in self._parked:
            return  # a new reader came meanwhile (its subscribe is already on the wire)
        with contextlib.suppress(redis.RedisError, OSError):
            await self._pubsub.unsubscribe(name)

    async def _read(self) -> None:
        try:
            while self._parked or self._confirmed:
                message = await self._pubsub.get_message(timeout=READ_SECONDS)
                if message is None:
                    continue
                name = message["channel"].decode() if isinstance(message["channel"], bytes) else message["channel"]
                if message["type"] == "subscribe":
                    confirmed = self._confirmed.get(name)
                    if confirmed is not None and not confirmed.done():
                        confirmed.set_result(None)
                elif message["type"] == "message":
                    for changed in self._parked.get(name, ()):
                        changed.set()
        except (redis.RedisError, OSError) as exc:
            # The connection is gone: every parked reader reads again now (it
            # may have missed a push), and the next reader connects afresh.
            log.warning("log readers' subscription lost: %s", exc, extra={"event": "logs.wait_unsubscribed"})
            for readers in self._parked.values():
                for changed in readers:
                    changed.set()
            for confirmed in self._confirmed.values():
                if not confirmed.done():
                    confirmed.cancel()
            pubsub, self._pubsub = self._pubsub, None
            with contextlib.suppress(Exception):
                await pubsub.aclose()


_watchers: dict[asyncio.AbstractEventLoop, Watcher] = {}


def watcher() -> Watcher:
    """This event loop's watcher (made on first use)."""
    loop = asyncio.get_running_loop()
    found = _watchers.get(loop)
    if found is None:
        found = _watchers[loop] = Watcher(loop, settings.REDIS_URL)
    return found
