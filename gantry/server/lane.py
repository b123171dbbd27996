"""The runner protocol's hot calls answered straight from the ASGI scope, under gantry.asgi (docs/operations.md).

Through Django, every runner call crosses a2wsgi, the middleware, the URL
resolver and DRF's dispatch (request wrapping, negotiation, authentication,
serializer binding) before it reaches one statement, and that Python costs
more than the statement. For the calls a well-behaved runner and coordinator
make (status, ready, accept, done, deregister, the live-log push, and the
poll's first attempt) this lane does only what the call needs: verify the
token (a cached check), hold the path to the token's run binding, run the
route's one statement with the token's group folded in (no separate
authentication read), and answer the bytes the Django view answers, headers
included.

It answers only calls that succeed. Anything else (a header it does not
expect, a body the one strict JSON parser refuses (gantry.api.parsers) or
outside the serializers' plain shapes (their ``fast_validate``), a token
that does not verify, a guard that fails, a database error) goes to the
Django application unchanged: this module returns None before anything was
written or after a statement that changed nothing, so every refusal, its
code and its wording stay the views'. After a write has committed it never
hands over (a second attempt would see its own effect): an unexpected error
there answers 500 as Django would.

What it must agree with Django on is derived from Django at start-up
(gantry.server.facts): each route's path from the URL pattern of its view,
the headers and the request metric the configured middleware adds to each of
its answers (found by running the middleware over a canned answer), the host
check (HttpRequest.get_host), the bearer header (gantry.api.auth), the
``Allow`` header (the view's methods). A route whose facts cannot be derived
exactly is off, with the reason logged at start; ``GANTRY_FAST_LANE=false``
turns the whole lane off. ``gantry.wsgi`` and ``runserver`` never use it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections
from django.http import HttpRequest
from django.utils import timezone
from prometheus_client import Counter
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from gantry import conf
from gantry.api import runner_views
from gantry.api.auth import bearer_token, group_check, group_of_row, runner_claims, token_group
from gantry.api.parsers import strict_json
from gantry.api.runner_views import ClaimSerializer, DoneSerializer, ReadySerializer, RunStatusSerializer
from gantry.core import services, tokens
from gantry.core.errors import GantryError
from gantry.core.models import GroupKind, RunnerStatus
from gantry.dispatch import claim as dispatch
from gantry.dispatch import coordinators
from gantry.logs import live as live_logs
from gantry.logs import services as log_services
from gantry.logs import views as log_views
from gantry.logs.views import LivePushSerializer
from gantry.server import asyncpoll, facts, lanedb
from gantry.sql import statement as prepared
from gantry.web.http_metrics import REQUEST_SECONDS

log = logging.getLogger("gantry.api")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]

# Bodies the lane reads itself (ready's and done's are a few hundred bytes;
# a live-log push carries up to a chunk's gzip in base64, under Django's own
# body limit); a larger one, or one without a Content-Length, is Django's.
MAX_BODY = 64 * 1024

CALLS = Counter(
    "gantry_fast_lane_requests_total",
    "Hot runner calls by route and by who answered: served (this lane) or django (handed over).",
    ["route", "outcome"],
)
SERVED, DJANGO = "served", "django"

_ACCEPTED = frozenset({b"*/*", b"application/json"})  # FastContentNegotiation's own shortcut
_JSON = b"application/json"
# A value of the routes' ids, for the path each route's probe requests.
_SAMPLE_ID = uuid.UUID(int=0)


# ---------------------------------------------------------------- requests


@dataclass
class Call:
    """One admitted request: the path's ids, the bearer token, and the body (bytes) when the route reads one."""

    ids: dict[str, uuid.UUID]
    token: str
    query: bytes
    body: bytes = b""
    deferred: asyncpoll.Deferred | None = None  # the poll's: what gantry.server.asgi reads to park it
    # The coordinator identity headers as sent (the poll records them, gantry.dispatch.coordinators).
    coordinator: dict[bytes, bytes] = field(default_factory=dict)


@dataclass(eq=False)
class Route:
    """One hot call: what the lane does for it (written here) and what Django says about it (derived)."""

    name: str
    method: str
    view: type[APIView]
    # The call's answer or None (Django's); a plan route's handler is a plan
    # (gantry.sql.statement) of that, run on the event loop under gantry.asgi
    # (:func:`aserve`) or on a request thread (:func:`serve`).
    handler: Callable[[Call], Any]
    # The answers the handler gives when it serves: (status, with a JSON body).
    answers: tuple[tuple[int, bool], ...]
    ids: tuple[str, ...] = ()  # the path parameters the handler reads
    body: bool = False
    plan: bool = False
    query: bool = False  # the poll's ?wait=
    max_body: int = MAX_BODY
    # Whether its thread may keep the connection for its next call (not the
    # poll's: its threads hold none while polls are parked).
    sticky: bool = True

    # Derived from Django by derive(): the path, and each answer's headers.
    binding: facts.Binding | None = field(default=None, repr=False)
    off: str | None = None  # why the lane leaves this route to Django
    shapes: dict[tuple[int, bool], facts.Shape] = field(default_factory=dict, repr=False)

    def answer(self, status: int, body: bytes | None = None) -> Answer:
        """The view's answer as the middleware leaves it: its headers, the length filled in."""
        shape = self.shapes[(status, body is not None)]
        return status, shape.headers(body or b""), body or b""


def derive(route: Route, *, probe: bool = True) -> Route:
    """Fill in ``route``'s facts from Django (gantry.server.facts), or say in ``route.off`` why it is off.

    The path is bound even when the route is not probed (``probe=False``, the
    lane off): gantry.server.asgi finds the poll by it.
    """
    route.binding, route.shapes, route.off = None, {}, None
    try:
        route.binding = facts.bind(route.view, route.ids, _SAMPLE_ID)
        if not probe:
            route.off = "GANTRY_FAST_LANE is false"
            return route
        if not callable(getattr(route.view, route.method.lower(), None)):
            raise facts.Off(f"{route.view.__name__} does not answer {route.method}")
        view = route.view()
        view.setup(HttpRequest())  # as as_view() does per request: a GET view answers HEAD too
        allow = ", ".join(view.allowed_methods).encode()
        route.shapes = facts.shapes(route.binding, method=route.method, allow=allow,
                                    answers=(*route.answers, _FAILED), body=route.body)  # fmt: skip
    except facts.Off as exc:
        route.off = str(exc)
    return route


def admit(route: Route, scope: dict[str, Any]) -> Call | None:
    """The call's parts when its request is one this lane answers as Django would; None: Django's."""
    if scope.get("root_path") or (scope.get("query_string") and not route.query):
        return None
    assert route.binding is not None  # route_for hands out only routes that are on
    ids = route.binding.ids(scope["path"])
    if ids is None:
        return None
    seen: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _READ_HEADERS:
            if name in seen:
                return None  # a repeated one: Django would see them joined
            seen[name] = value
    if not _host_ok(seen.get(b"host"), seen.get(b"x-forwarded-host")):
        return None
    if seen.get(b"accept", b"*/*") not in _ACCEPTED or b"transfer-encoding" in seen:
        return None
    length = seen.get(b"content-length", b"0")
    if not length.isdigit() or int(length) > (route.max_body if route.body else 0):
        return None
    if route.body and (int(length) == 0 or seen.get(b"content-type") != _JSON):
        return None
    try:
        token = bearer_token(seen.get(b"authorization", b""))
    except AuthenticationFailed:
        return None
    if token is None:
        return None
    coordinator = {name: seen[name] for name in _COORDINATOR_HEADERS if name in seen}
    return Call(ids=ids, token=token, query=scope.get("query_string", b""), coordinator=coordinator)


_COORDINATOR_HEADERS = frozenset(raw for _, _, raw in coordinators.HEADERS)
_READ_HEADERS = frozenset(
    {b"host", b"x-forwarded-host", b"accept", b"authorization", b"content-length", b"content-type",
     b"transfer-encoding", *_COORDINATOR_HEADERS}
)  # fmt: skip


# Raised before the route's write, or by its statement (rolled back): nothing
# changed, and the view's own path says what went wrong.
_HANDED_OVER = (DatabaseError, psycopg.Error, GantryError, AuthenticationFailed, tokens.TokenInvalid)


def serve(route: Route, call: Call) -> Answer | None:
    """Answer the call, or None when Django must (nothing was written). Runs in a worker thread."""
    started = time.perf_counter()
    answer: Answer | None = None
    try:
        result = route.handler(call)
        answer = prepared.drive(result) if route.plan else result
    except _HANDED_OVER as exc:
        log.debug("fast lane hands %s to Django: %r", route.name, exc)
        answer = None
    except Exception:
        answer = _failed(route)
    finally:
        _release_connection(keep=route.sticky and answer is not None and answer[0] < 500)
    return _settled(route, answer, started)


async def aserve(route: Route, call: Call) -> Answer | None:
    """:func:`serve` for a plan route, on the event loop: its statements on this loop's connections (lanedb)."""
    started = time.perf_counter()
    answer: Answer | None = None
    try:
        plan = route.handler(call)  # a generator: the token's checks run at its first step, in adrive
        async with lanedb.connection() as conn:
            answer = await prepared.adrive(plan, conn)
    except _HANDED_OVER as exc:
        log.debug("fast lane hands %s to Django: %r", route.name, exc)
        answer = None
    except Exception:
        answer = _failed(route)
    return _settled(route, answer, started)


_FAILED = (500, True)
_SERVER_ERROR = {"code": "server_error", "detail": "internal error; see the server log"}


def _failed(route: Route) -> Answer:
    # After a committed write a second attempt would see its own effect:
    # answer as Django's handler500 does, with the traceback in the log.
    log.exception("fast lane %s failed", route.name)
    return route.answer(500, JSONRenderer().render(_SERVER_ERROR))


def _settled(route: Route, answer: Answer | None, started: float) -> Answer | None:
    if answer is None:
        _counted(route.name, DJANGO).inc()
        return None
    _counted(route.name, SERVED).inc()
    timer = _timed(route, answer[0], answer[2] != b"")  # a JSON answer's body is never empty
    if timer is not None:
        timer.observe(time.perf_counter() - started)
    return answer


# The metrics' labelled children, looked up once: labels() per call would
# rebuild the label tuple and take the metric's lock on every answer.
_children: dict[tuple[str, str], Any] = {}
_timers: dict[tuple[str, int], Any] = {}


def _counted(route: str, outcome: str) -> Any:
    child = _children.get((route, outcome))
    if child is None:
        child = _children[(route, outcome)] = CALLS.labels(route, outcome)
    return child


def _timed(route: Route, status: int, is_json: bool) -> Any:
    """The request metric's series the middleware records for this answer (the probe's), or None: none."""
    key = (route.name, status)
    if key not in _timers:
        shape = route.shapes.get((status, is_json))
        _timers[key] = REQUEST_SECONDS.labels(*shape.timed) if shape is not None and shape.timed else None
    return _timers[key]


# How long a request thread keeps its database connection between hot calls
# (from its checkout), instead of returning it to the pool after each one; 0:
# never (set by gantry.server.asgi through allow_sticky_connections).
STICKY_SECONDS = 0.0


def allow_sticky_connections(threads: int) -> bool:
    """Let the lane's threads keep their connections when the pool has one for each of ``threads``; answers whether.

    A kept connection stays with its thread while the thread is idle, so with
    more threads than the pool holds, a thread could wait for a connection
    that idle threads keep. Off without a pool of at least that size.
    """
    global STICKY_SECONDS
    options = settings.DATABASES[DEFAULT_DB_ALIAS].get("OPTIONS")
    pool = options.get("pool") if isinstance(options, dict) else None
    max_size = pool.get("max_size") if isinstance(pool, dict) else None
    ok = isinstance(max_size, int) and max_size >= threads
    STICKY_SECONDS = 5.0 if ok else 0.0
    if not ok and ENABLED:
        log.info("fast lane: connections are returned after each call (pool max %s < %d threads)", max_size, threads,
                 extra={"event": "api.fast_lane_no_sticky"})  # fmt: skip
    return ok


def _release_connection(*, keep: bool) -> None:
    """After a call: keep the thread's connection for its next hot call, or hand it back as request_finished does.

    Django's pool hands a request a connection and takes it back at the end
    (CONN_MAX_AGE 0): per hot call a checkout (the pool's lock and health
    check), Django's connection setup and a return, for a call that needs one
    statement. A served call leaves the connection idle in autocommit, so the
    thread keeps it for its next hot call, up to :data:`STICKY_SECONDS` after
    it was checked out; then it goes back (the pool's lifetime and health
    rules apply at the next checkout). A call handed to Django, an error, or a
    transaction still open returns it at once, and Django's own next request
    on the thread starts with request_started's close_old_connections, which
    returns it too. A thread holds at most one connection, so the pool's size
    still bounds them (GANTRY_DB_POOL_MAX against GANTRY_SYNC_THREADS,
    docs/operations.md).
    """
    db = connections[DEFAULT_DB_ALIAS]
    conn = db.connection
    if (
        keep
        and STICKY_SECONDS > 0
        and conn is not None
        and not db.errors_occurred
        and not db.in_atomic_block
        and db.close_at is not None
        and time.monotonic() < db.close_at + STICKY_SECONDS
        and conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    ):
        return
    close_old_connections()


def _runner_token(call: Call) -> tuple[uuid.UUID, uuid.UUID, int]:
    """(runner, run, group) of a runner token; anything else raises (Django answers it)."""
    claims = tokens.decode(call.token)
    if claims.audience != tokens.AUD_RUNNER:
        raise tokens.TokenInvalid("not a runner token")
    runner_id, run_id, group_id = runner_claims(claims)
    if group_id is None:
        raise tokens.TokenInvalid("no group")
    return runner_id, run_id, group_id


def _json_body(call: Call, fast_validate: Callable[[Any], dict[str, Any] | None]) -> dict[str, Any] | None:
    """The body's validated data for a plain body; None for anything else, which Django's parser and serializer
    then judge (a refusal here is one there: the same strict_json)."""
    try:
        data = strict_json(call.body)
    except (GantryError, APIException):
        return None
    return fast_validate(data)


# ---------------------------------------------------------------- the routes
#
# Each route calls the state machine in one place (its ``services`` or
# ``log_services`` call), with the token's group folded into the statement.


def _status(call: Call) -> prepared.Plan[Answer | None]:
    runner_id, run_id, group_id = _runner_token(call)
    if call.ids["run_id"] != run_id:
        return None
    found, run_status = yield from services.status_plan(runner_id=runner_id, group_id=group_id, run_id=run_id,
                                                        bound=True, now=_now())  # fmt: skip
    if not found or run_status is None:
        return None  # wrote nothing: the runner or the run is gone
    return STATUS.answer(200, JSONRenderer().render(RunStatusSerializer.fast_represent(run_status)))


def _ready(call: Call) -> prepared.Plan[Answer | None]:
    runner_id, _, group_id = _runner_token(call)
    data = _json_body(call, ReadySerializer.fast_validate)
    if call.ids["runner_id"] != runner_id or data is None:
        return None
    status = yield from services.ready_plan(runner_id=runner_id, group_id=group_id, metadata=data, now=_now())
    if status is None or status == RunnerStatus.BUSY:
        return None  # busy, or gone: the view's path names the refusal
    return READY.answer(204)


def _accept(call: Call) -> prepared.Plan[Answer | None]:
    runner_id, run_id, group_id = _runner_token(call)
    if call.ids["run_id"] != run_id:
        return None
    accepted = yield from services.accept_plan(run_id=run_id, runner_id=runner_id, group_id=group_id, now=_now())
    if isinstance(accepted, services.Refused):
        return None
    run, api_token = accepted
    return ACCEPT.answer(200, JSONRenderer().render(runner_views.accept_answer(run, api_token)))


def _done(call: Call) -> prepared.Plan[Answer | None]:
    runner_id, run_id, group_id = _runner_token(call)
    data = _json_body(call, DoneSerializer.fast_validate)
    if call.ids["run_id"] != run_id or data is None:
        return None
    done = yield from services.finish_plan(run_id=run_id, runner_id=runner_id, group_id=group_id, now=_now(),
                                           report=data)  # fmt: skip
    if isinstance(done, services.Refused):
        return None  # a replay, a refusal: the view's path names it
    live_logs.delete_soon(run_id)
    return DONE.answer(204)


def _live(call: Call) -> Answer | None:
    runner_id, run_id, group_id = _runner_token(call)
    data = _json_body(call, LivePushSerializer.fast_validate)
    if call.ids["run_id"] != run_id or data is None:
        return None
    if not log_services.live_push_hot(run_id=run_id, runner_id=runner_id, runner_group_id=group_id, **data):
        return None  # not executing on this runner: a drop or a refusal, the view's path says which
    return LIVE.answer(204)


def _deregister(call: Call) -> prepared.Plan[Answer | None]:
    runner_id, _, group_id = _runner_token(call)
    if call.ids["runner_id"] != runner_id:
        return None
    _, _, gone = yield from services.deregister_plan(runner_id=runner_id, group_id=group_id, now=_now())
    if not gone:
        return None
    return DEREGISTER.answer(204)


def _poll(call: Call) -> Answer | None:
    """The poll's first attempt, as PollView makes it under gantry.asgi (``call.deferred`` says whether to park)."""
    deferred = call.deferred
    assert deferred is not None
    claims = tokens.decode(call.token)
    if claims.audience != tokens.AUD_GROUP:
        return None
    wait = _wait(call.query)
    if wait is None:
        return None
    try:
        who = coordinators.identity(lambda header: _text(call.coordinator.get(header.lower().encode())))
    except GantryError:
        return None  # the view answers the 400
    checked = group_check(claims)
    vouch = None
    if checked is None:  # a token that does not name its org: its group is read first
        group = token_group(claims)
        if group.kind == GroupKind.GITHUB_ACTIONS:
            return None  # refused by the view (backend_dispatched_group)
    else:
        # The token's read rides in the claim's own message; its row decides
        # whether the claim stands (a revoked token, a gone group, another
        # org, a github_actions group: rolled back, and Django answers).
        group, (statement, args) = checked
        version = claims.raw.get("ver")
        vouch = dispatch.Vouch(
            statement,
            args,
            check=lambda row: _self_hosted(group_of_row(claims, row)),
            # What group_of_row and _self_hosted judge, for the claim statement to judge too (claim.Vouch).
            token_version=version if type(version) is int and 0 <= version < 2**63 else None,
        )
    try:
        result = deferred.attempt(
            group=group, wait=wait, claim=lambda: dispatch.claim(group=group, raise_throttled=True, vouch=vouch)
        )
    except dispatch.Throttled:
        result = None
    # After the claim: its group check passed (a refused token is the view's, which records nothing).
    coordinators.record(group_id=group.id, who=who)
    if result is None:
        return POLL.answer(204)
    return POLL.answer(200, JSONRenderer().render(ClaimSerializer.fast_represent(result)))


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("latin-1")  # as a WSGI environ carries a header


def _self_hosted(group: Any) -> None:
    if group.kind == GroupKind.GITHUB_ACTIONS:
        raise AuthenticationFailed("a github_actions group does not poll")  # the view answers 403 for it


_WAIT = re.compile(rb"(?:wait=([0-9]{1,2}(?:\.[0-9]{1,3})?))?")


def _wait(query: bytes) -> float | None:
    """``?wait=`` in its plain forms (none, or seconds as digits), checked as the view checks it; else None."""
    m = _WAIT.fullmatch(query)
    if m is None:
        return None
    try:
        return runner_views.poll_wait(m.group(1).decode() if m.group(1) else "0")
    except GantryError:
        return None


def _now() -> datetime:
    return timezone.now()


_JSON_200, _EMPTY_204 = (200, True), (204, False)
STATUS = Route("status", "GET", runner_views.StatusView, _status, (_JSON_200,), ids=("run_id",), plan=True)
READY = Route("ready", "POST", runner_views.ReadyView, _ready, (_EMPTY_204,), ids=("runner_id",), body=True,
              plan=True)  # fmt: skip
ACCEPT = Route("accept", "POST", runner_views.AcceptView, _accept, (_JSON_200,), ids=("run_id",), plan=True)
DONE = Route("done", "POST", runner_views.DoneView, _done, (_EMPTY_204,), ids=("run_id",), body=True, plan=True)
LIVE = Route("live", "POST", log_views.LiveLogView, _live, (_EMPTY_204,), ids=("run_id",), body=True,
             max_body=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)  # fmt: skip
DEREGISTER = Route("deregister", "DELETE", runner_views.DeregisterView, _deregister, (_EMPTY_204,),
                   ids=("runner_id",), plan=True)  # fmt: skip
POLL = Route("poll", "GET", runner_views.PollView, _poll, (_JSON_200, _EMPTY_204), query=True, sticky=False)
ROUTES = (STATUS, READY, ACCEPT, DONE, LIVE, DEREGISTER, POLL)

ENABLED = conf.server().fast_lane
for _route in ROUTES:
    derive(_route, probe=ENABLED)
    if ENABLED and _route.off is not None:
        log.warning("the fast lane leaves %s to Django: %s", _route.name, _route.off,
                    extra={"event": "api.fast_lane_off", "route": _route.name})  # fmt: skip
_host_ok = facts.host_check()
# By method and last path segment (admit checks the whole path): only the routes that are on.
_BY_METHOD_AND_TAIL = {
    (r.method, r.binding.tail): r for r in ROUTES if r.off is None and r.binding is not None
}  # fmt: skip


def route_for(scope: dict[str, Any]) -> Route | None:
    """The lane's route for this request by method and last path segment, if the lane serves it."""
    return _BY_METHOD_AND_TAIL.get((scope["method"], scope["path"].rsplit("/", 1)[-1]))


def fresh(route: Route) -> Route:
    """A copy of ``route`` with its facts derived again (under the settings of the moment: tests)."""
    return derive(dataclasses.replace(route))
