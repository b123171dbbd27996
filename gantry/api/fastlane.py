"""The runner protocol's hot calls answered straight from the ASGI scope, under gantry.asgi (docs/performance.md).

Under the production server mode every runner call crossed a2wsgi, ten
middlewares, the URL resolver and DRF's dispatch before it reached a statement
that PostgreSQL runs in a fraction of that time: about 3 ms of Python per call
against 0.75 ms for a bare ``/healthz``. For the calls a well-behaved runner
and coordinator make (status, ready, accept, done, deregister, the live-log
push, and the poll's first attempt) this lane does only what the call needs:
verify the token (a cached check), hold the path to the token's run binding,
run the route's one statement with the token's group folded in (no separate
authentication read), and answer the bytes the Django view answers, headers
included.

It answers only calls that succeed. Anything else (a header it does not
expect, a body outside gantry.api.fastbody's plain shapes, a token that does
not verify, a guard that fails, a database error) goes to the Django
application unchanged: this module returns None before anything was written
or after a statement that changed nothing, so every refusal, its code and its
wording stay the views'. After a write has committed it never hands over (a
second attempt would see its own effect): an unexpected error there answers
500 as Django would.

The lane reproduces the effect of exactly :data:`KNOWN_MIDDLEWARE` on these
answers (security headers, host check, the request metric). With another
middleware list, or ``GANTRY_FAST_LANE=false``, it is off and Django answers
every call. ``gantry.wsgi`` and ``runserver`` never use it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, close_old_connections, connections
from django.http.request import split_domain_port, validate_host
from django.urls import resolve
from django.urls.converters import UUIDConverter
from django.utils import timezone
from prometheus_client import Counter
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from gantry.api import fastbody, lanedb, runner_views
from gantry.api.auth import group_check, group_of_row, runner_claims, token_group
from gantry.core import services, tokens
from gantry.core.errors import GantryError
from gantry.core.models import GroupKind, RunnerStatus
from gantry.dispatch import asyncpoll
from gantry.dispatch import claim as dispatch
from gantry.env import envbool
from gantry.logs import live as live_logs
from gantry.logs import services as log_services
from gantry.logs import views as log_views
from gantry.sql import statement as prepared
from gantry.web.http_metrics import REQUEST_SECONDS

log = logging.getLogger("gantry.api")

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]

# The middleware whose effect on a runner call's answer this lane reproduces
# (below: _security_headers, _host_ok, the REQUEST_SECONDS observation). A
# change to settings.MIDDLEWARE turns the lane off until it is checked here.
KNOWN_MIDDLEWARE = (
    "gantry.web.http_metrics.HttpMetricsMiddleware",
    "gantry.web.middleware.BodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)
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

_UUID = UUIDConverter.regex
_ACCEPTED = frozenset({b"*/*", b"application/json"})  # FastContentNegotiation's own shortcut
_JSON = b"application/json"


def _disabled_reason() -> str | None:
    if not envbool("GANTRY_FAST_LANE", True):
        return "GANTRY_FAST_LANE is false"
    if tuple(settings.MIDDLEWARE) != KNOWN_MIDDLEWARE:
        return "settings.MIDDLEWARE differs from the list the lane reproduces (gantry/api/fastlane.py)"
    if settings.SECURE_SSL_REDIRECT or settings.SECURE_HSTS_SECONDS or settings.DISALLOWED_USER_AGENTS:
        return "SECURE_SSL_REDIRECT, SECURE_HSTS_SECONDS or DISALLOWED_USER_AGENTS is set (not reproduced here)"
    if settings.PREPEND_WWW or settings.APPEND_SLASH:
        return "PREPEND_WWW or APPEND_SLASH is set (CommonMiddleware would redirect)"
    if settings.USE_X_FORWARDED_HOST or settings.USE_X_FORWARDED_PORT:
        return "USE_X_FORWARDED_HOST or USE_X_FORWARDED_PORT is set (the host check reads the Host header alone)"
    return None


def _security_headers() -> list[tuple[bytes, bytes]]:
    """What XFrameOptionsMiddleware, CommonMiddleware (the length, added by the caller) and SecurityMiddleware add."""
    out = [(b"x-frame-options", str(settings.X_FRAME_OPTIONS).upper().encode())]
    tail = []
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        tail.append((b"x-content-type-options", b"nosniff"))
    policy = settings.SECURE_REFERRER_POLICY
    if policy:
        value = policy if isinstance(policy, str) else ",".join(policy)
        tail.append((b"referrer-policy", value.encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        tail.append((b"cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
    return [*out, (b"content-length", b""), *tail]  # the empty length is filled per answer


# ---------------------------------------------------------------- requests


@dataclass
class Call:
    """One admitted request: the path's ids, the bearer token, and the body (bytes) when the route reads one."""

    ids: dict[str, uuid.UUID]
    token: str
    query: bytes
    body: bytes = b""
    deferred: asyncpoll.Deferred | None = None  # the poll's: what gantry.asgi reads to park it


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    path: re.Pattern[str]
    view: type[APIView]
    # The call's answer or None (Django's); a plan route's handler is a plan
    # (gantry.core.prepared) of that, run on the event loop under gantry.asgi
    # (:func:`aserve`) or on the request thread (:func:`serve`).
    handler: Callable[[Call], Any]
    body: bool = False
    plan: bool = False
    query: bool = False  # the poll's ?wait=
    max_body: int = MAX_BODY
    # Whether its thread may keep the connection for its next call (not the
    # poll's: its threads hold none while polls are parked).
    sticky: bool = True

    def answer(self, status: int, body: bytes | None = None) -> Answer:
        """The view's answer: its content type, DRF's Allow, then the middleware's headers."""
        headers = [(b"content-type", _JSON)] if body is not None else []
        headers.append((b"allow", _allow[self.name]))
        for name, value in _headers:
            headers.append((name, str(len(body or b"")).encode()) if name == b"content-length" else (name, value))
        return status, headers, body or b""


def admit(route: Route, scope: dict[str, Any]) -> Call | None:
    """The call's parts when its request is one this lane answers as Django would; None: Django's."""
    if scope.get("root_path") or (scope.get("query_string") and not route.query):
        return None
    ids = route.path.fullmatch(scope["path"])
    if ids is None:
        return None
    seen: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _READ_HEADERS:
            if name in seen:
                return None  # a repeated one: Django would see them joined
            seen[name] = value
    if not _host_ok(seen.get(b"host")) or seen.get(b"accept", b"*/*") not in _ACCEPTED:
        return None
    if b"transfer-encoding" in seen:
        return None
    length = seen.get(b"content-length", b"0")
    if not length.isdigit() or int(length) > (route.max_body if route.body else 0):
        return None
    if route.body and (int(length) == 0 or seen.get(b"content-type") != _JSON):
        return None
    auth = seen.get(b"authorization", b"").split()
    if len(auth) != 2 or auth[0].lower() != b"bearer" or not auth[1].isascii():
        return None
    return Call(ids={k: uuid.UUID(v) for k, v in ids.groupdict().items()}, token=auth[1].decode(),
                query=scope.get("query_string", b""))  # fmt: skip


_READ_HEADERS = frozenset(
    {b"host", b"accept", b"authorization", b"content-length", b"content-type", b"transfer-encoding"}
)
_hosts: dict[bytes, bool] = {}


def _host_ok(host: bytes | None) -> bool:
    """Django's ALLOWED_HOSTS check (HttpRequest.get_host), remembered per Host value."""
    if host is None:
        return False
    ok = _hosts.get(host)
    if ok is None:
        allowed = settings.ALLOWED_HOSTS
        if settings.DEBUG and not allowed:
            allowed = [".localhost", "127.0.0.1", "[::1]"]
        domain, _ = split_domain_port(host.decode("latin-1"))
        ok = bool(domain) and validate_host(domain, allowed)
        if len(_hosts) < 64:
            _hosts[host] = ok
    return ok


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
    _timed(route, answer[0]).observe(time.perf_counter() - started)
    return answer


# The metrics' labelled children, looked up once (labels() per call was 1% of the lane).
_children: dict[tuple[str, str], Any] = {}
_timers: dict[tuple[str, int], Any] = {}


def _counted(route: str, outcome: str) -> Any:
    child = _children.get((route, outcome))
    if child is None:
        child = _children[(route, outcome)] = CALLS.labels(route, outcome)
    return child


def _timed(route: Route, status: int) -> Any:
    child = _timers.get((route.name, status))
    if child is None:
        child = REQUEST_SECONDS.labels(route=_labels[route.name], method=route.method, status=str(status))
        _timers[(route.name, status)] = child
    return child


_SERVER_ERROR = {"code": "server_error", "detail": "internal error; see the server log"}

# How long a request thread keeps its database connection between hot calls
# (from its checkout), instead of returning it to the pool after each one; 0:
# never (set by gantry.asgi through allow_sticky_connections).
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
    (CONN_MAX_AGE 0): per hot call that checkout, its bookkeeping and the
    return were 7% of the lifecycle's Python. A served call leaves the
    connection idle in autocommit, so the thread keeps it for its next hot
    call, up to :data:`STICKY_SECONDS` after it was checked out; then it goes
    back (the pool's lifetime and health rules apply at the next checkout). A
    call handed to Django, an error, or a transaction still open returns it at
    once, and Django's own next request on the thread starts with
    request_started's close_old_connections, which returns it too. A thread
    holds at most one connection, so the pool's size still bounds them
    (GANTRY_DB_POOL_MAX against GANTRY_SYNC_THREADS, docs/operations.md).
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


def _json_body(call: Call, shape: Callable[[Any], dict[str, Any] | None]) -> dict[str, Any] | None:
    try:
        return shape(json.loads(call.body.decode("utf-8")))
    except ValueError:  # not UTF-8 or not JSON (UnicodeDecodeError is a ValueError)
        return None


# ---------------------------------------------------------------- the routes


def _status(call: Call) -> prepared.Plan[Answer | None]:
    runner_id, run_id, group_id = _runner_token(call)
    if call.ids["run_id"] != run_id:
        return None
    found, run_status = yield from services.status_plan(runner_id=runner_id, group_id=group_id, run_id=run_id,
                                                        bound=True, now=_now())  # fmt: skip
    if not found or run_status is None:
        return None  # wrote nothing: the runner or the run is gone
    return STATUS.answer(200, JSONRenderer().render(runner_views.status_answer(run_status)))


def _ready(call: Call) -> prepared.Plan[Answer | None]:
    runner_id, _, group_id = _runner_token(call)
    data = _json_body(call, fastbody.ready)
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
    data = _json_body(call, fastbody.done)
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
    data = _json_body(call, fastbody.live_push)
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
    if result is None:
        return POLL.answer(204)
    return POLL.answer(200, JSONRenderer().render(runner_views.claim_answer(result)))


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


STATUS = Route("status", "GET", re.compile(rf"/api/v1/runs/(?P<run_id>{_UUID})/status"), runner_views.StatusView,
               _status, plan=True)  # fmt: skip
READY = Route("ready", "POST", re.compile(rf"/api/v1/runners/(?P<runner_id>{_UUID})/ready"), runner_views.ReadyView,
              _ready, body=True, plan=True)  # fmt: skip
ACCEPT = Route("accept", "POST", re.compile(rf"/api/v1/runs/(?P<run_id>{_UUID})/accept"), runner_views.AcceptView,
               _accept, plan=True)  # fmt: skip
DONE = Route("done", "POST", re.compile(rf"/api/v1/runs/(?P<run_id>{_UUID})/done"), runner_views.DoneView, _done,
             body=True, plan=True)  # fmt: skip
LIVE = Route("live", "POST", re.compile(rf"/api/v1/runs/(?P<run_id>{_UUID})/logs/live"), log_views.LiveLogView,
             _live, body=True, max_body=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)  # fmt: skip
DEREGISTER = Route("deregister", "DELETE", re.compile(rf"/api/v1/runners/(?P<runner_id>{_UUID})/deregister"),
                   runner_views.DeregisterView, _deregister, plan=True)  # fmt: skip
POLL = Route("poll", "GET", re.compile("/api/v1/runner-groups/poll"), runner_views.PollView, _poll, query=True,
             sticky=False)  # fmt: skip
ROUTES = (STATUS, READY, ACCEPT, DONE, LIVE, DEREGISTER, POLL)
_BY_METHOD_AND_TAIL = {(r.method, r.path.pattern.rsplit("/", 1)[1]): r for r in ROUTES}


def route_for(scope: dict[str, Any]) -> Route | None:
    """The lane's route for this request by method and last path segment (admit checks the whole path)."""
    if not ENABLED:
        return None
    return _BY_METHOD_AND_TAIL.get((scope["method"], scope["path"].rsplit("/", 1)[-1]))


def _route_facts() -> tuple[dict[str, bytes], dict[str, str]]:
    """Each route's Allow header (its view's methods, as DRF answers them) and metric label (Django's pattern)."""
    allow, labels = {}, {}
    zero = str(uuid.UUID(int=0))
    for route in ROUTES:
        sample = route.path.pattern.replace(f"(?P<run_id>{_UUID})", zero).replace(f"(?P<runner_id>{_UUID})", zero)
        match = resolve(sample)
        view_class = getattr(match.func, "view_class", None) or getattr(match.func, "cls", None)
        if view_class is not route.view:
            raise RuntimeError(f"{sample} resolves to {view_class}, not {route.view}: fix gantry/api/fastlane.py")
        view = route.view()
        view.setup(None)  # as as_view() does per request: a GET view answers HEAD too
        allow[route.name] = ", ".join(view.allowed_methods).encode()
        labels[route.name] = match.route
    return allow, labels


DISABLED_REASON = _disabled_reason()
ENABLED = DISABLED_REASON is None
if not ENABLED and DISABLED_REASON != "GANTRY_FAST_LANE is false":
    log.warning("the fast lane is off: %s", DISABLED_REASON, extra={"event": "api.fast_lane_off"})
_allow, _labels = _route_facts()
_headers = _security_headers()
