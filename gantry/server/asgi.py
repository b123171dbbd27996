"""The production server's ASGI application (``gunicorn gantry.asgi -k uvicorn_worker.UvicornWorker``).

Three routes through one event loop per process (docs/operations.md, "Sizing"):

- The long poll (``GET /api/v1/runner-groups/poll``, its path found in the URL
  configuration): parked on the event loop (gantry.server.asyncpoll) with no
  thread and no database connection. Its first attempt (authentication,
  validation, one claim) runs in a small pool of ``GANTRY_POLL_THREADS``
  threads (a woken poll's claim has one more of its own): the fast lane's
  for a plain request, else the ordinary Django view's, so answers are byte
  for byte those of the WSGI server; only the waiting moved.
- The runner's hot calls (status, ready, accept, live-log push, done,
  deregister): gantry.server.lane, straight from the scope. The
  one-statement calls run on this event loop with the lane's own
  connections (gantry.server.lanedb); the live-log push (a Redis write) on
  the sync threads below. Whatever the lane does not answer itself (every
  refusal, anything unusual) goes on to Django with its body replayed.
- Everything else: the Django WSGI application in a pool of
  ``GANTRY_SYNC_THREADS`` threads, through a2wsgi. Not Django's own ASGI
  handler: it runs sync views with ``thread_sensitive=True``, on one thread
  per process, so one slow request would hold up every other.

The knobs are read from gantry.conf.server(). ``gantry.wsgi`` and
``manage.py runserver`` keep serving every route, the poll too (parked on a
thread there, gantry.dispatch.longpoll).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.core.wsgi import get_wsgi_application
from django.db import connection

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gantry.settings")

django_app = get_wsgi_application()

from a2wsgi import WSGIMiddleware  # noqa: E402 - after Django is set up
from a2wsgi.wsgi import build_environ  # noqa: E402

from gantry import conf  # noqa: E402
from gantry.api.runner_views import ClaimSerializer  # noqa: E402
from gantry.dispatch import longpoll  # noqa: E402
from gantry.logs import live as live_logs  # noqa: E402
from gantry.logs import views as log_views  # noqa: E402
from gantry.server import asyncpoll, facts, lane, lanedb, logwait  # noqa: E402
from gantry.sql import claim as claim_sql  # noqa: E402

log = logging.getLogger("gantry.api")
_conf = conf.server()
# The lane's one-statement calls (status, ready, accept, done, deregister) on
# the event loop with connections of its own (gantry.server.lanedb); false (a
# diagnostic): on the sync threads with Django's connections.
ON_LOOP = _conf.fast_lane_loop
# The poll's path, as the URL configuration routes it to PollView; None (it
# could not be read, logged by the lane): polls go to Django and wait on a thread.
POLL_PATH = lane.POLL.binding.literal if lane.POLL.binding is not None else None

_sync = WSGIMiddleware(django_app, workers=_conf.sync_threads)  # type: ignore[arg-type]
# The sync threads may keep a connection each between hot calls, beside the
# poll and wake threads' own: only when the pool has that many.
lane.allow_sticky_connections(_conf.sync_threads + _conf.poll_threads + 1)
_poll_pool = ThreadPoolExecutor(max_workers=_conf.poll_threads, thread_name_prefix="gantry-poll")
# Wakes (a claim for a new run, the hand-off query, the counters) have threads of
# their own: a burst of new polls (deadlines, a reconnecting fleet) queued in the
# poll pool must not delay the answer to a run that just became claimable.
_wake_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gantry-wake")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]

_hub: asyncpoll.Hub | None = None
_hub_lock = threading.Lock()


def _call_view(scope: dict[str, Any], deferred: asyncpoll.Deferred) -> Answer:
    """The Django application for one poll request, in a pool thread: its whole answer, read."""
    return _call_app(scope, {asyncpoll.ENVIRON_KEY: deferred})


def _call_app(scope: dict[str, Any], extra: dict[str, Any]) -> Answer:
    """The Django application for one bodiless request, ``extra`` in its environ, in a pool thread: its answer."""
    environ: dict[str, Any] = dict(build_environ(scope, io.BytesIO(b"")))  # type: ignore[arg-type]
    environ.update(extra)
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, headers]
        return lambda data: None

    result: Any = django_app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        # request_finished: the database connection goes back to the pool here.
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started
    return int(status.split(" ", 1)[0]), [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers], body


def _first_pass(scope: dict[str, Any], deferred: asyncpoll.Deferred) -> Answer:
    """The poll's first attempt: the fast lane's when it takes the request, else the Django view's."""
    call = lane.admit(lane.POLL, scope) if lane.POLL.off is None else None
    if call is not None:
        call.deferred = deferred
        answer = lane.serve(lane.POLL, call)
        if answer is not None:
            return answer
    return _call_view(scope, deferred)


def _wake_attempt(group: Any, parked: Answer) -> Answer | None:
    """A woken poll's attempt: the claim alone, as the threaded wait retries it (no second authentication).

    The poll was authenticated and validated by its first pass, and the
    threaded wait (gantry.dispatch.longpoll) retries with that same group
    too. Skipping the view's stack (the middleware, DRF's request wrapping,
    authentication's read of the group) leaves a wake the claim and a render.
    The answer is the view's: its serializer, its renderer, the first pass's
    headers (the middleware's) with the body's own. None: nothing claimed,
    park again.
    """
    from rest_framework.renderers import JSONRenderer

    from gantry.dispatch import claim as dispatch

    asyncpoll.count_attempt(asyncpoll.WAKE)
    try:
        result = dispatch.claim(group=group, raise_throttled=True)
    except dispatch.Throttled:
        return parked  # the budget is spent: answer now, as the view does
    finally:
        connection.close()  # back to the pool before the poll parks again
    if result is None:
        return None
    body = JSONRenderer().render(ClaimSerializer.fast_represent(result))
    headers = [(k, v) for k, v in parked[1] if k not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return 200, headers, body


def _notify_followers(org_id: int) -> None:
    try:
        with connection.cursor() as cur:
            cur.execute(claim_sql.NOTIFY, [claim_sql.FOLLOW_CHANNEL, str(org_id)])
    finally:
        connection.close()


async def _send(send: Any, answer: Answer) -> None:
    status, headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def hub() -> asyncpoll.Hub:
    """This event loop's hub, made (and subscribed to the process's listener) on first use."""
    global _hub
    loop = asyncio.get_running_loop()
    with _hub_lock:
        if _hub is None or _hub.loop is not loop:

            async def check(group_ids: list[int]) -> Any:
                return await loop.run_in_executor(_wake_pool, asyncpoll.claimable_counts, group_ids)

            async def flush() -> None:
                await loop.run_in_executor(_wake_pool, asyncpoll.flush_counts)

            async def forward(org_id: int) -> None:
                await loop.run_in_executor(_wake_pool, _notify_followers, org_id)

            lst = longpoll.listener()
            lst.wants_lead = True
            _hub = asyncpoll.Hub(loop, check, leader=lambda: lst.leader, forward=forward)
            _hub.spawn(_hub.flusher(flush))
            lst.subscribe(_hub.notify_threadsafe)
            longpoll.on_shutdown(_hub.shutdown_threadsafe)
            if longpoll.shutting_down():
                _hub.shutdown()
        return _hub


async def _poll(scope: dict[str, Any], receive: Any, send: Any) -> None:
    loop = asyncio.get_running_loop()
    h = hub()
    started = loop.time()
    mark = h.mark()
    first = asyncpoll.Deferred()
    answer = await loop.run_in_executor(_poll_pool, _first_pass, scope, first)
    if not first.empty or first.group_id is None or first.org_id is None:
        await _send(send, answer)  # a claim, an error, a throttle, or wait=0: as under WSGI
        return
    # Parked from here: the first attempt's 204 is the answer at the deadline.
    w = h.waiter(group_id=first.group_id, org_id=first.org_id, deadline=started + first.wait)
    disconnect = asyncio.ensure_future(_disconnected(receive))
    try:
        retry = h.should_retry(w, mark)
        while True:
            if not retry:
                woken = h.park(w)
                remaining = w.deadline - loop.time()
                if remaining <= 0:
                    break
                waits: set[asyncio.Future[Any]] = {woken, disconnect}
                done, _ = await asyncio.wait(waits, timeout=remaining, return_when="FIRST_COMPLETED")
                if disconnect in done:
                    return  # the client is gone: nobody to hand a claim to
                if woken not in done or woken.result() == asyncpoll.SHUTDOWN:
                    break
            h.begin_attempt(w)
            mark = h.mark()
            try:
                reply = await loop.run_in_executor(_wake_pool, _wake_attempt, first.group, answer)
            except Exception:
                # A database error, say: the view's own path answers it as it would any request.
                again = asyncpoll.Deferred(retry=True)
                reply = await loop.run_in_executor(_poll_pool, _call_view, scope, again)
                if again.empty:
                    reply = None
            if reply is not None:
                h.remove(w)
                h.after_attempt(w)
                await _send(send, reply)
                return
            h.park(w)
            retry = h.should_retry(w, mark)
            if not retry:
                h.after_attempt(w)
    finally:
        h.remove(w)
        disconnect.cancel()
    await _send(send, answer)


def _log_read_binding() -> facts.Binding | None:
    try:
        return facts.bind(log_views.RunLogView, ("pk",), uuid.UUID(int=0))
    except facts.Off as exc:
        # Readers are answered at once (wait ignored), as under WSGI.
        log.warning("log reads with ?wait= are not parked: %s", exc, extra={"event": "logs.wait_off"})
        return None


LOG_READ = _log_read_binding()


async def _log_read(scope: dict[str, Any], receive: Any, send: Any, run_id: uuid.UUID) -> None:
    """``GET /runs/{id}/logs?wait=``: the view's answer, held on this loop while the view says it may park
    (gantry.server.logwait), then asked again; no thread and no database connection while held."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    w = logwait.watcher()
    try:
        changed = await w.watch(run_id)  # confirmed before the first read: no push falls between
    except logwait.Unavailable:
        await _sync(scope, receive, send)  # type: ignore[arg-type]
        return
    disconnect = asyncio.ensure_future(_disconnected(receive))
    logwait.PARKED.inc()
    try:
        while True:
            park = live_logs.Park()
            answer = await loop.run_in_executor(_sync.executor, _call_app, scope, {live_logs.PARK_ENVIRON_KEY: park})
            remaining = started + park.wait - loop.time()
            if park.wait <= 0 or remaining <= 0:
                break
            woken = asyncio.ensure_future(changed.wait())
            done, _ = await asyncio.wait({woken, disconnect}, timeout=remaining, return_when="FIRST_COMPLETED")
            woken.cancel()
            if disconnect in done:
                return  # nobody to answer
            if woken not in done:
                break  # the deadline: the last answer (nothing new) is the answer
            changed.clear()  # before reading again: a push during the read wakes the next park
    finally:
        logwait.PARKED.dec()
        w.unwatch(run_id, changed)
        disconnect.cancel()
    await _send(send, answer)


async def _fast(route: lane.Route, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A hot runner call: the fast lane answers it (on this loop, or a sync thread), or Django does (the body
    replayed)."""
    call = lane.admit(route, scope)
    if call is None:
        await _sync(scope, receive, send)  # type: ignore[arg-type]
        return
    if route.body:
        body = await _read_body(receive)
        if body is None:
            return  # the client went away mid-body
        call.body = body
    if route.plan and ON_LOOP:
        answer = await lane.aserve(route, call)
    else:
        answer = await asyncio.get_running_loop().run_in_executor(_sync.executor, lane.serve, route, call)
    if answer is not None:
        await _send(send, answer)
        return
    await _sync(scope, _replay(call.body, receive) if route.body else receive, send)  # type: ignore[arg-type]


async def _read_body(receive: Any) -> bytes | None:
    """The whole request body (admit bounded it by its Content-Length); None when the client disconnected."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive: Any) -> Any:
    """A receive that hands over the body already read, then the connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def again() -> Any:
        return pending.pop() if pending else await receive()

    return again


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            hub()
            if threading.current_thread() is threading.main_thread():
                # Chained before the server's own handler (uvicorn installs it
                # for the duration of serve(), so gunicorn.conf.py's hook would
                # be replaced): parked polls answer at once, then the server
                # drains as usual.
                longpoll.shutdown_on(signal.SIGTERM)
                longpoll.shutdown_on(signal.SIGINT)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await lanedb.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] == POLL_PATH and scope["method"] == "GET":
        await _poll(scope, receive, send)
    elif (
        scope["type"] == "http"
        and scope["method"] == "GET"
        and b"wait=" in scope.get("query_string", b"")
        and LOG_READ is not None
        and (ids := LOG_READ.ids(scope["path"])) is not None
    ):
        await _log_read(scope, receive, send, ids["pk"])
    elif scope["type"] == "http" and (route := lane.route_for(scope)) is not None and route is not lane.POLL:
        await _fast(route, scope, receive, send)
    elif scope["type"] == "lifespan":
        await _lifespan(receive, send)
    else:
        await _sync(scope, receive, send)  # type: ignore[arg-type]
