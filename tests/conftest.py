"""Shared fixtures: a few named personas instead of ad-hoc users.

- ``acme``: the org under test; ``globex``: another org.
- ``owner``: admin of acme; ``teammate``: member of acme; ``outsider``: admin of globex;
  ``root``: a superuser (super-admin).
Every test runs against real PostgreSQL and Redis (the machine's when
``DATABASE_URL`` / ``REDIS_URL`` are set, else the embedded ones).
"""

from __future__ import annotations

import ast
import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from gantry import conf
from gantry.core import services
from gantry.core.models import Membership, Organization, Role, RunnerGroup, Stack
from gantry.dispatch import longpoll


def _serialise_ast_parse() -> None:
    """Let one thread at a time build Python AST objects.

    Before 3.13, CPython keeps the AST constructor's recursion counter in
    per-interpreter state shared by every thread, so two threads in
    ``ast.parse`` at once can raise ``SystemError: AST constructor recursion
    depth mismatch``. Two do meet here: pytest parses a failed test's source
    to show it while a server thread of the test formats a traceback
    (3.11's traceback parses each line for its carets). pytest then dies with
    an INTERNALERROR instead of reporting the failure, and the rest of the run
    is lost. Serialising the calls removes the race and changes no result.
    """
    if sys.version_info >= (3, 13) or getattr(ast.parse, "_gantry_serialised", False):
        return
    lock = threading.Lock()
    parse = ast.parse

    @functools.wraps(parse)
    def serialised(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    serialised._gantry_serialised = True  # type: ignore[attr-defined]
    ast.parse = serialised  # type: ignore[assignment]


_serialise_ast_parse()

# Tests scrape /metrics right after each change they make, so the scrape cache
# is off for the suite (and the servers it starts, which inherit the variable);
# tests/ops/test_metrics_access.py turns it on to test it.
os.environ.setdefault("GANTRY_METRICS_CACHE_SECONDS", "0")
conf.get.cache_clear()  # settings.py read it before this module ran

SPEC: dict[str, Any] = {"steps": [{"name": "hello", "run": "echo hello"}], "env": {}, "timeout_seconds": 60}


def _client(user: User | None = None) -> APIClient:
    client = APIClient()
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def acme(db: None) -> Organization:
    return Organization.objects.create(slug="acme", name="Acme")


@pytest.fixture
def globex(db: None) -> Organization:
    return Organization.objects.create(slug="globex", name="Globex")


def _member(username: str, org: Organization, role: str, *, staff: bool = False) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username, is_staff=staff)
    Membership.objects.create(user=user, organization=org, role=role)
    return user


@pytest.fixture
def owner(acme: Organization) -> User:
    return _member("owner", acme, Role.ADMIN, staff=True)


@pytest.fixture
def teammate(acme: Organization) -> User:
    return _member("teammate", acme, Role.MEMBER)


@pytest.fixture
def outsider(globex: Organization) -> User:
    return _member("outsider", globex, Role.ADMIN, staff=True)


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser(username="root", password="pw-root", email="root@example.com")


@pytest.fixture
def anon() -> APIClient:
    return _client()


@pytest.fixture
def owner_api(owner: User) -> APIClient:
    return _client(owner)


@pytest.fixture
def teammate_api(teammate: User) -> APIClient:
    return _client(teammate)


@pytest.fixture
def outsider_api(outsider: User) -> APIClient:
    return _client(outsider)


@pytest.fixture
def root_api(root: User) -> APIClient:
    return _client(root)


@pytest.fixture
def stack(acme: Organization) -> Stack:
    return services.stack_create(org=acme, name="web", labels={"gantry:runner-group:os": "linux"}, spec=SPEC)


@pytest.fixture
def group(acme: Organization) -> RunnerGroup:
    group, _token = services.runner_group_create(org=acme, name="linux", labels={"os": "linux", "arch": "amd64"})
    return group


@pytest.fixture
def globex_stack(globex: Organization) -> Stack:
    return services.stack_create(org=globex, name="api", spec=SPEC)


@pytest.fixture(scope="session")
def _no_stale_throttle_buckets() -> None:
    """Org ids restart with every test database, so a bucket an earlier session left in Redis
    would be charged to this session's org of the same id: start each session with none.
    Within a session ids never repeat, so once is enough."""
    import contextlib

    import redis

    from tests.throttle.helpers import clear_buckets

    # No Redis: the tests that need it say so themselves.
    with contextlib.suppress(redis.RedisError):
        clear_buckets()


@pytest.fixture(autouse=True)
def _no_stale_throttle_buckets_before_the_first_service_test(request: pytest.FixtureRequest) -> None:
    # Set up by the first test outside the unit tier, never by a unit test (no Redis there).
    if not in_unit_tier(request.node):
        request.getfixturevalue("_no_stale_throttle_buckets")


@pytest.fixture
def clean_buckets() -> Iterator[None]:
    """No throttle bucket before or after the test (tests that spend or drain tokens)."""
    from tests.throttle.helpers import clear_buckets

    clear_buckets()
    yield
    clear_buckets()


@pytest.fixture(scope="session")
def _stop_longpoll_listener(django_db_setup: None) -> Iterator[None]:
    """A long poll starts a listener holding a connection to the test database.

    Depends on django_db_setup, so it is torn down first: DROP DATABASE refuses
    while the listener is still connected.
    """
    yield
    longpoll.stop_listener()


@pytest.fixture(autouse=True)
def _listener_stops_before_the_database_goes(request: pytest.FixtureRequest) -> None:
    # Only for tests that set up the database: the fast tier (-m unit) never creates one.
    if _SERVICE_FIXTURES.intersection(request.fixturenames) or request.node.get_closest_marker("django_db"):
        request.getfixturevalue("_stop_longpoll_listener")


# Requests the live server's threads are serving now (thread idents), from
# Django's request_started to request_finished; the test's own thread excluded.
_serving: set[int] = set()
_serving_lock = threading.Lock()


def _request_started(sender: object, **kwargs: object) -> None:
    if threading.current_thread() is not threading.main_thread():
        with _serving_lock:
            _serving.add(threading.get_ident())


def _request_finished(sender: object, **kwargs: object) -> None:
    with _serving_lock:
        _serving.discard(threading.get_ident())


request_started.connect(_request_started, dispatch_uid="tests.serving.started")
request_finished.connect(_request_finished, dispatch_uid="tests.serving.finished")


def requests_in_flight() -> int:
    """How many requests other threads (the live server's) are serving right now."""
    with _serving_lock:
        return len(_serving)


def settle_live_server(timeout: float = 15.0) -> None:
    """Let every request the live server is still serving answer, before the test's database goes.

    A process the test started and killed (a coordinator, a runner) can leave
    its long poll parked in a server thread for up to its ``wait``. Left alone,
    that poll retries its claim after the test: in the next test's database,
    or in a test with no database at all, where the error it raises reaches
    Django's process-wide ``got_request_exception`` signal and the test client
    of whatever test runs then re-raises it as its own (CI once failed
    ``test_schema`` this way on a poll a coordinator of ``test_reconcile_e2e``
    had left parked). Parked polls answer at once, as when a server stops;
    then the shutdown is forgotten, with the listener, for the next test.
    """
    if not requests_in_flight():
        return
    longpoll.begin_shutdown()
    try:
        deadline = time.monotonic() + timeout
        while requests_in_flight() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        longpoll.stop_listener()
    left = requests_in_flight()
    assert not left, f"{left} live-server request(s) still running {timeout:.0f} s after the test"


@pytest.fixture(autouse=True)
def _live_server_settles(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test on the live server: its requests end before its database is flushed.

    Autouse, and it asks for transactional_db itself, so it is set up before
    the test's own fixtures (torn down after they stop their processes) and
    after the database (torn down before the flush).
    """
    if "live_server" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("transactional_db")
    yield
    settle_live_server()


@pytest.fixture
def claimable_listener() -> Iterator[psycopg.Connection]:
    """A connection LISTENing on the channel parked long polls wake on."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("LISTEN gantry_claimable")
        yield conn


def drain_notifications(conn: psycopg.Connection) -> list[str]:
    """The payloads (org ids) delivered within half a second."""
    return [n.payload for n in conn.notifies(timeout=0.5)]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The figures the chaos and fuzz suites measured (tests/figures.py)."""
    from tests.figures import print_figures

    print_figures(terminalreporter, config)


# ---------------------------------------------------------------- tiers
#
# `python3 dev.py test -m unit` runs the fast tier: tests that need no database,
# no Redis and no server of their own. A test is in it unless it asks for the
# database (a django_db mark, a db or live-server fixture), is marked for real
# processes or outside services, or lives where everything talks to Redis or
# starts servers. Everything else is the integration tier (the default run
# takes both).
_SERVICE_FIXTURES = frozenset({"db", "transactional_db", "live_server", "own_redis", "clean_buckets"})
_SERVICE_MARKS = frozenset({"django_db", "e2e", "docker", "chaos", "ha", "fuzz", "browser"})
# Folders whose tests all reach Redis, PostgreSQL or start processes, fixtures or not.
_SERVICE_DIRS = (
    "tests/throttle/",
    "tests/e2e/",
    "tests/k8s/",
    "tests/github/",
    "tests/chaos/",
    "tests/ha/",
    "tests/browser/",
)


@pytest.hookimpl(tryfirst=True)  # before -m selects on the mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path.relative_to(config.rootpath))
        services = (
            _SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            or any(item.get_closest_marker(m) for m in _SERVICE_MARKS)
            or path.startswith(_SERVICE_DIRS)
        )
        if not services:
            item.add_marker(pytest.mark.unit)


def in_unit_tier(node: pytest.Item) -> bool:
    """Whether a test is in the fast tier: it, and every fixture it gets, must leave PostgreSQL and Redis alone.

    An autouse fixture that reaches either asks this first (or is kept out of
    the unit tier by the marks above), so `-m unit` passes with both down.
    """
    return node.get_closest_marker("unit") is not None


# ---------------------------------------------------------------- the unit tier's guard
#
# While a unit-tier test is set up, runs and tears down its own fixtures, any
# attempt to open a PostgreSQL or Redis connection raises ServiceInUnitTest,
# naming the test; an attempt the code under test swallowed (Gantry degrades
# quietly without Redis in places) still fails the test in its next phase.
# pytest-django already refuses Django's own database connection there; this
# covers everything else: psycopg directly (the long-poll listener, /readyz,
# the fast lane's pool), redis-py sync and asyncio, Celery's broker.


class ServiceInUnitTest(RuntimeError):
    """A test in the unit tier (or one of its fixtures) opened a PostgreSQL or Redis connection."""


# The node id of the unit-tier test whose setup, call or teardown is running; None otherwise.
_unit_test: str | None = None
# Threads alive when a test outside the unit tier ended (the long-poll listener, psycopg's pool
# workers): they reconnect when they please, which is not the unit test's doing. In a `-m unit`
# run there are none, so there the guard covers every thread.
_service_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_violations: list[str] = []


def _refuse(service: str) -> None:
    test = _unit_test
    if test is None or threading.current_thread() in _service_threads:
        return
    message = (
        f"{test} is in the unit tier (`-m unit`: no database, Redis or process) but opened a {service} "
        "connection: give the test the fixture or mark it needs (db, django_db, ...), which takes it out of "
        "the unit tier, or keep the fixture that connects away from unit tests (in_unit_tier, tests/conftest.py)"
    )
    _violations.append(message)
    raise ServiceInUnitTest(message)


def _guard_service_connections() -> None:
    """Route every PostgreSQL and Redis connection through _refuse first (installed once, at import)."""
    import redis.asyncio.connection
    import redis.connection

    # psycopg's one generator behind every connection: Connection.connect, AsyncConnection.connect,
    # psycopg.connect (an alias bound at import, so patching connect would miss it) and the pools.
    base: Any = psycopg.BaseConnection
    connect_gen = base.__dict__["_connect_gen"].__func__

    def _connect_gen(cls: Any, *args: Any, **kwargs: Any) -> Any:
        _refuse("PostgreSQL")
        return connect_gen(cls, *args, **kwargs)

    base._connect_gen = classmethod(_connect_gen)

    # redis-py's connect() and its connection pools all open the socket here (sync and asyncio).
    sync_cls: Any = redis.connection.AbstractConnection
    sync_connect = sync_cls.connect_check_health

    def connect_check_health(self: Any, *args: Any, **kwargs: Any) -> Any:
        _refuse("Redis")
        return sync_connect(self, *args, **kwargs)

    sync_cls.connect_check_health = connect_check_health

    async_cls: Any = redis.asyncio.connection.AbstractConnection
    async_connect = async_cls.connect_check_health

    async def aconnect_check_health(self: Any, *args: Any, **kwargs: Any) -> Any:
        _refuse("Redis")
        return await async_connect(self, *args, **kwargs)

    async_cls.connect_check_health = aconnect_check_health


_guard_service_connections()


def _carries(exc: BaseException | None) -> bool:
    """Whether the exception is (or was raised while handling) a ServiceInUnitTest: already reported."""
    seen = 0
    while exc is not None and seen < 50:
        if isinstance(exc, ServiceInUnitTest):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _report_swallowed(exc: BaseException | None) -> None:
    """Fail the phase for refused connections the code under test caught and carried on from."""
    violations = list(dict.fromkeys(_violations))
    _violations.clear()
    if violations and not _carries(exc):
        raise ServiceInUnitTest("\n".join(violations)) from exc


def _reporting_swallowed() -> Iterator[None]:
    """A hook wrapper's body: the phase runs, then any connection it swallowed is reported."""
    try:
        result = yield
    except BaseException as exc:
        _report_swallowed(exc)
        raise
    _report_swallowed(None)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    global _unit_test
    # Armed before any fixture (a session fixture a unit test is the first to ask for included).
    _unit_test = item.nodeid if in_unit_tier(item) else None
    return (yield from _reporting_swallowed())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _reporting_swallowed())


@pytest.fixture(autouse=True)
def _unit_tier_guard_disarms(request: pytest.FixtureRequest) -> Iterator[None]:
    """Torn down after the test's own fixtures, before wider-scoped ones: a module or session
    fixture an earlier integration test set up (the test database) may close its connections
    when a unit test happens to be the last of its scope, and that is not the unit test's doing."""
    yield
    global _unit_test
    _unit_test = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _unit_test
    try:
        result = yield
    except BaseException as exc:
        _report_swallowed(exc)
        raise
    finally:
        _unit_test = None
        if not in_unit_tier(item):
            _service_threads.update(threading.enumerate())
    _report_swallowed(None)
    return result
