"""What the fast lane derives from Django at start-up (gantry.server.facts): routes, the middleware's headers, hosts.

Each case changes Django's configuration the way a later edit might (a
middleware added, a security setting, a route moved) and derives a route
afresh: the lane follows the change where it can reproduce it exactly, and
turns the route off, naming why, where it cannot. No database: the probe's
canned answers never reach a view.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import override_settings
from django.urls import resolve
from prometheus_client import REGISTRY

from gantry.api.auth import bearer_token
from gantry.server import facts, lane
from gantry.web.http_metrics import REQUEST_SECONDS

Middleware = Callable[[HttpRequest], HttpResponse]


class StampMiddleware:
    """Adds a constant header: reproducible."""

    def __init__(self, get_response: Middleware) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response["X-Stamp"] = "gantry"
        return response


class NonceMiddleware(StampMiddleware):
    """Adds a header that differs on every request: not reproducible."""

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response["X-Request-Id"] = str(uuid.uuid4())
        return response


class CookieMiddleware(StampMiddleware):
    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.set_cookie("seen", "1")
        return response


class RefuseMiddleware(StampMiddleware):
    def __call__(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(status=403)


def with_middleware(name: str) -> Any:
    return override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, f"{__name__}.{name}"])


def headers(route: lane.Route, status: int, body: bytes | None) -> dict[bytes, bytes]:
    return dict(route.answer(status, body)[1])


def test_it_serves_every_route_under_the_configured_settings() -> None:
    assert lane.ENABLED
    for route in lane.ROUTES:
        assert route.off is None, (route.name, route.off)
        assert route.binding is not None
        match = resolve(route.binding.sample)
        assert route.binding.label == match.route
        assert lane.route_for({"method": route.method, "path": route.binding.sample}) is route


def test_it_binds_a_path_with_the_patterns_own_regex_and_converters() -> None:
    binding = lane.STATUS.binding
    assert binding is not None
    run = uuid.uuid4()
    assert binding.ids(f"/api/v1/runs/{run}/status") == {"run_id": run}
    for path in (f"/api/v1/runs/{run}/status/", f"/api/v1/runs/{str(run).upper()}/status", "/api/v1/runs/1/status",
                 f"/api/v2/runs/{run}/status", f"/api/v1/runs/{run}/statuses"):  # fmt: skip
        assert binding.ids(path) is None, path
    poll = lane.POLL.binding
    assert poll is not None
    assert poll.literal == "/api/v1/runner-groups/poll"


def test_its_answers_carry_what_the_middleware_adds() -> None:
    body = b'{"status": "running"}'
    got = lane.STATUS.answer(200, body)
    assert got[2] == body
    assert dict(got[1]) == {
        b"content-type": b"application/json",
        b"allow": b"GET, HEAD, OPTIONS",
        b"x-frame-options": b"DENY",
        b"content-length": str(len(body)).encode(),
        b"x-content-type-options": b"nosniff",
        b"referrer-policy": b"same-origin",
        b"cross-origin-opener-policy": b"same-origin",
    }
    assert b"content-type" not in headers(lane.READY, 204, None)
    assert headers(lane.READY, 204, None)[b"content-length"] == b"0"


def test_a_header_a_new_middleware_adds_is_reproduced() -> None:
    with with_middleware("StampMiddleware"):
        route = lane.fresh(lane.STATUS)
    assert route.off is None
    assert headers(route, 200, b"{}")[b"x-stamp"] == b"gantry"
    assert b"x-stamp" not in headers(lane.STATUS, 200, b"{}")  # the lane's own routes are as they started


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (with_middleware("NonceMiddleware"), "vary with the body, the scheme or the moment"),
        (with_middleware("CookieMiddleware"), "sets a cookie"),
        (with_middleware("RefuseMiddleware"), "with 403"),
        # Compresses a body the probe's client accepts gzip for.
        (override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]), "body"),
        (override_settings(SECURE_SSL_REDIRECT=True), "with 301 to https://"),
        (override_settings(SECURE_HSTS_SECONDS=3600), "vary with the body, the scheme or the moment"),
        (override_settings(PREPEND_WWW=True), "with 301"),
        (override_settings(ALLOWED_HOSTS=[]), "no host name passes ALLOWED_HOSTS"),
    ],
)
def test_an_answer_the_middleware_changes_turns_the_route_off(change: Any, reason: str) -> None:
    with change:
        route = lane.fresh(lane.STATUS)
    assert route.off is not None
    assert reason in route.off


def test_a_moved_route_moves_the_lane_or_turns_it_off() -> None:
    with override_settings(ROOT_URLCONF="tests.asgi.moved_urls"):
        routes = {route.name: lane.fresh(route) for route in lane.ROUTES}
    status = routes["status"]
    assert status.off is None
    assert status.binding is not None
    assert status.binding.sample == f"/v2/beats/{uuid.UUID(int=0)}/heartbeat"
    assert status.binding.label == "v2/beats/<uuid:run_id>/heartbeat"
    assert status.binding.tail == "heartbeat"
    assert routes["live"].off is None
    assert "ReadyView is in 0 URL patterns" in (routes["ready"].off or "")
    assert "AcceptView is in 2 URL patterns" in (routes["accept"].off or "")
    assert "an earlier pattern takes its paths" in (routes["done"].off or "")
    assert "not read as UUID" in (routes["deregister"].off or "")
    assert routes["poll"].binding is not None
    assert routes["poll"].binding.literal == "/v2/runner-groups/poll"


def test_the_probe_leaves_no_request_metric_behind() -> None:
    # Under a URL configuration no request of this process used: the series the probe creates are its own.
    def counts() -> dict[Any, float]:
        return {tuple(s.labels.items()): s.value for m in REQUEST_SECONDS.collect() for s in m.samples}

    before = counts()
    with override_settings(ROOT_URLCONF="tests.asgi.moved_urls"):
        route = lane.fresh(lane.STATUS)
    assert counts() == before
    # ...while it learnt which series the middleware records each answer under.
    label = "v2/beats/<uuid:run_id>/heartbeat"
    assert route.shapes[(200, True)].timed == (label, "GET", "200")
    assert route.shapes[(500, True)].timed == (label, "GET", "500")
    assert REGISTRY.get_sample_value("gantry_http_request_duration_seconds_count",
                                     {"route": label, "method": "GET", "status": "200"}) is None  # fmt: skip


@pytest.mark.parametrize(
    ("hosts", "debug", "forwarded_setting", "host", "forwarded", "ok"),
    [
        (["gantry.example.com"], False, False, b"gantry.example.com", None, True),
        (["gantry.example.com"], False, False, b"gantry.example.com:8443", None, True),
        (["gantry.example.com"], False, False, b"evil.example.com", None, False),
        ([".example.com"], False, False, b"a.example.com", None, True),
        (["*"], False, False, b"anything", None, True),
        (["*"], False, False, b"bad host!", None, False),
        ([], True, False, b"localhost", None, True),
        ([], False, False, b"localhost", None, False),
        (["gantry.example.com"], False, False, None, None, False),
        # X-Forwarded-Host counts only under USE_X_FORWARDED_HOST, and then wins over Host.
        (["gantry.example.com"], False, False, b"gantry.example.com", b"evil.example.com", True),
        (["gantry.example.com"], False, True, b"gantry.example.com", b"evil.example.com", False),
        (["gantry.example.com"], False, True, b"internal", b"gantry.example.com", True),
    ],
)
def test_the_host_check_is_djangos(
    hosts: list[str], debug: bool, forwarded_setting: bool, host: bytes | None, forwarded: bytes | None, ok: bool
) -> None:
    with override_settings(ALLOWED_HOSTS=hosts, DEBUG=debug, USE_X_FORWARDED_HOST=forwarded_setting):
        check = facts.host_check()
        assert check(host, forwarded) is ok
        assert check(host, forwarded) is ok  # remembered

        request = HttpRequest()
        if host is not None:
            request.META["HTTP_HOST"] = host.decode()
        if forwarded is not None:
            request.META["HTTP_X_FORWARDED_HOST"] = forwarded.decode()
        if host is not None:
            try:
                request.get_host()
            except Exception:
                assert not ok
            else:
                assert ok


@pytest.mark.parametrize(
    ("header", "token"),
    [(b"Bearer abc", "abc"), (b"bearer  abc ", "abc"), (b"Token abc", None), (b"", None), (b"Bearer", "!"),
     (b"Bearer a b", "!"), (b"Bearer \xe9t\xe9", "\ufffdt\ufffd")],
)  # fmt: skip
def test_the_lane_reads_the_bearer_header_as_authentication_does(header: bytes, token: str | None) -> None:
    from rest_framework.exceptions import AuthenticationFailed

    try:
        got = bearer_token(header)
    except AuthenticationFailed:
        got = "!"
    assert got == token
    scope = {"method": "GET", "path": f"/api/v1/runs/{uuid.uuid4()}/status", "query_string": b"",
             "headers": [(b"host", b"localhost"), (b"authorization", header)]}  # fmt: skip
    call = lane.admit(lane.STATUS, scope)
    assert (call.token if call is not None else None) == (token if token != "!" else None)
