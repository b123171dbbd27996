"""The fast lane (gantry.server.lane) under the production ASGI mode: Django's answers, without Django's stack.

Every hot call a runner makes is served by the lane and answers what the
Django view answers (status, headers, body), checked against the same call
through Django in this process (the test client, the same middleware). Every
call the lane does not take (a refusal, a replay, an unusual header or body)
reaches Django with its body intact and gets Django's answer. Which side
answered is read from the server's ``gantry_fast_lane_requests_total``, so a
lane that silently handed everything to Django would fail here.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.server import asyncpoll, lane
from tests.asgi.server import POLL, Server, asgi_server
from tests.dispatch.helpers import deploy, make_group, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

READY = {"hostname": "h1", "launcher": "local", "pid": 42}
LIVE = {"chunk_index": 0, "sealed_chunks": 0, "data": base64.b64encode(gzip.compress(b"step 1\n")).decode()}
DONE = {"outcome": "succeeded", "exit_code": 0, "sealed_chunks": 1, "manifest": {"count": 1, "sha256": ["ab" * 32]}}
# Headers that differ between two answers by nature: uvicorn's own, and its framing of a body Django sent
# without a length (a 400 for a bad Host header); the test client has none of them.
VARYING = {"date", "server", "transfer-encoding"}


@pytest.fixture(scope="module")
def server(
    django_db_setup: None, django_db_blocker: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with django_db_blocker.unblock(), asgi_server(tmp_path_factory.mktemp("fast")) as s:  # type: ignore[attr-defined]
        yield s


Reply = tuple[int, dict[str, str], bytes]


def call(server: Server, method: str, path: str, token: str | None = None, body: Any = None,
         headers: dict[str, str] | None = None, raw: bytes | None = None) -> Reply:  # fmt: skip
    """One request to the server: (status, headers without the varying ones, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", int(server.base.rsplit(":", 1)[1]), timeout=30)
    try:
        sent = {"Authorization": f"Bearer {token}"} if token else {}
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        if data is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        conn.request(method, path, body=data, headers=sent)
        resp = conn.getresponse()
        out = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders() if k.lower() not in VARYING}, out
    finally:
        conn.close()


def django(method: str, path: str, token: str | None = None, body: Any = None,
           headers: dict[str, str] | None = None, raw: bytes | None = None) -> Reply:  # fmt: skip
    """The same request through Django's own stack, in this process."""
    client = APIClient()
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()}
    if token:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    kwargs: dict[str, Any] = {"content_type": "application/json", "data": data} if data is not None else {}
    response = getattr(client, method.lower())(path, **kwargs, **extra)
    return response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content


def served(server: Server, route: str, outcome: str = lane.SERVED) -> float:
    try:
        return server.metric(f'gantry_fast_lane_requests_total{{outcome="{outcome}",route="{route}"}}')
    except AssertionError:
        return 0.0  # not counted yet: the series appears with its first call


def group_token(group: RunnerGroup) -> str:
    return tokens.mint_group_token(group_id=group.id, token_version=group.token_version)


def linux(org: Organization) -> RunnerGroup:
    return make_group(org, "linux", {"os": "linux"}, max_concurrent_runs=1000)


def lifecycle(send: Any, token: str) -> list[tuple[str, int, dict[str, str], Any]]:
    """poll → ready → accept → live push → status → done → deregister through ``send``: (call, status, headers,
    body) each."""
    out = []
    status, headers, body = send("GET", POLL + "?wait=0", token)
    claim = json.loads(body)
    out.append(("poll", status, headers, claim))
    run, runner, tok = claim["run_id"], claim["runner_id"], claim["runner_token"]
    steps = [
        ("ready", "POST", f"/api/v1/runners/{runner}/ready", READY),
        ("accept", "POST", f"/api/v1/runs/{run}/accept", None),
        ("live", "POST", f"/api/v1/runs/{run}/logs/live", LIVE),
        ("status", "GET", f"/api/v1/runs/{run}/status", None),
        ("done", "POST", f"/api/v1/runs/{run}/done", DONE),
        ("deregister", "DELETE", f"/api/v1/runners/{runner}/deregister", None),
    ]
    for name, method, path, payload in steps:
        status, headers, body = send(method, path, tok, payload)
        out.append((name, status, headers, json.loads(body) if body else None))
    return out


def shape(value: Any) -> Any:
    """A body with its per-run values (ids, tokens, times) replaced by their type: what must match across runs."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return value if isinstance(value, bool) or value is None else type(value).__name__


def test_every_hot_call_is_served_by_the_lane_and_answers_as_django(server: Server, acme: Organization) -> None:
    group = linux(acme)
    for name in ("web", "api"):
        deploy(make_stack(acme, name, {"os": "linux"}))
    before = {route.name: served(server, route.name) for route in lane.ROUTES}

    served_steps = lifecycle(lambda *a: call(server, *a), group_token(group))
    after = {route.name: served(server, route.name) for route in lane.ROUTES}
    assert {name: after[name] - before[name] for name in after} == dict.fromkeys(after, 1.0)

    plain = lifecycle(django, group_token(group))
    for (name, status, headers, body), (_, want_status, want_headers, want_body) in zip(
        served_steps, plain, strict=True
    ):
        assert status == want_status, name
        # Lengths differ only where a per-run value's digits do (ids, tokens).
        assert {k: v for k, v in headers.items() if k != "content-length"} == {
            k: v for k, v in want_headers.items() if k != "content-length"
        }, name
        assert shape(body) == shape(want_body), name
        assert ("content-length" in headers) == ("content-length" in want_headers), name
    assert served_steps[4][3] == plain[4][3] == {"status": "running", "cancel_requested": False}
    assert Run.objects.filter(organization=acme, status=RunStatus.SUCCEEDED).count() == 2
    assert not Runner.objects.filter(runner_group=group).exists()


def test_the_lane_records_the_request_metric_under_the_route_pattern(server: Server, acme: Organization) -> None:
    deploy(make_stack(acme, "web", {"os": "linux"}))
    name = (
        'gantry_http_request_duration_seconds_count{method="GET",route="api/v1/runs/<uuid:run_id>/status",status="200"}'
    )
    try:
        before = server.metric(name)
    except AssertionError:
        before = 0.0
    steps = lifecycle(lambda *a: call(server, *a), group_token(linux(acme)))
    assert [status for _, status, _, _ in steps] == [200, 204, 200, 204, 200, 204, 204]
    assert server.metric(name) == before + 1


def accepted(server: Server, group: RunnerGroup) -> tuple[str, str, str]:
    """(run, runner, runner token) of a run accepted through the lane."""
    status, _, body = call(server, "GET", POLL + "?wait=0", group_token(group))
    assert status == 200, body
    claim = json.loads(body)
    run, runner, tok = claim["run_id"], claim["runner_id"], claim["runner_token"]
    assert call(server, "POST", f"/api/v1/runners/{runner}/ready", tok, READY)[0] == 204
    assert call(server, "POST", f"/api/v1/runs/{run}/accept", tok)[0] == 200
    return run, runner, tok


def test_calls_the_lane_does_not_take_get_djangos_answer(server: Server, acme: Organization) -> None:
    group = linux(acme)
    for name in ("web", "api"):
        deploy(make_stack(acme, name, {"os": "linux"}))
    run, runner, tok = accepted(server, group)
    other_run, _, other_tok = accepted(server, group)
    gone = tokens.mint_runner_token(runner_id=uuid.uuid4(), run_id=uuid.UUID(run), group_id=group.id)
    # Each refuses or replays: nothing changes between the server's answer and Django's.
    cases: list[tuple[str, str, str, str | None, Any, dict[str, str], bytes | None]] = [
        ("status", "GET", f"/api/v1/runs/{run}/status", other_tok, None, {}, None),  # 403 run binding
        ("status", "GET", f"/api/v1/runs/{run}/status", gone, None, {}, None),  # 401 runner gone
        ("status", "GET", f"/api/v1/runs/{run}/status", tok + "x", None, {}, None),  # 401 forged
        ("status", "GET", f"/api/v1/runs/{run}/status", tok, None, {"Accept": "text/html"}, None),  # 406
        ("status", "GET", f"/api/v1/runs/{run}/status?format=json", tok, None, {}, None),
        ("status", "GET", f"/api/v1/runs/{run}/status", tok, None, {"Host": "evil.example"}, None),  # 400
        ("ready", "POST", f"/api/v1/runners/{runner}/ready", tok, {"pid": -1}, {}, None),  # 400, fields
        ("ready", "POST", f"/api/v1/runners/{runner}/ready", tok, READY, {}, None),  # 409 busy
        ("ready", "POST", f"/api/v1/runners/{runner}/ready", tok, None, {}, b'{"pid": NaN}'),  # 400
        ("ready", "POST", f"/api/v1/runners/{runner}/ready", tok, None, {}, b"not json"),  # 400 invalid_json
        ("accept", "POST", f"/api/v1/runs/{other_run}/accept", tok, None, {}, None),  # 403 run binding
        ("done", "POST", f"/api/v1/runs/{run}/done", tok, {**DONE, "sealed_chunks": 2}, {}, None),  # 400 manifest
        ("done", "POST", f"/api/v1/runs/{run}/done", tok, {"outcome": "cancelled"}, {}, None),  # 409 conflict
        ("live", "POST", f"/api/v1/runs/{run}/logs/live", tok, {**LIVE, "data": "not base64!"}, {}, None),  # 400
        ("live", "POST", f"/api/v1/runs/{run}/logs/live", tok, {**LIVE, "sealed_chunks": 1}, {}, None),  # 400
        ("live", "POST", f"/api/v1/runs/{other_run}/logs/live", tok, LIVE, {}, None),  # 403 run binding
        ("live", "POST", f"/api/v1/runs/{run}/logs/live", tok, {**LIVE, "extra": 1}, {}, None),  # 204: DRF drops it
        ("live", "POST", f"/api/v1/runs/{run}/logs/live", gone, LIVE, {}, None),  # 401 runner gone
        ("deregister", "DELETE", f"/api/v1/runners/{runner}/deregister", tok, None, {}, None),  # 409 holds run
        ("poll", "GET", POLL + "?wait=abc", group_token(group), None, {}, None),  # 400
        ("poll", "GET", POLL + "?wait=1&x=2", tok, None, {}, None),  # 403 a runner token
    ]
    for route, method, path, token, body, headers, raw in cases:
        was = served(server, route, lane.DJANGO)
        got = call(server, method, path, token, body, headers, raw)
        want = django(method, path, token, body, headers, raw)
        assert got[0] == want[0], (path, body, headers, got)
        assert got[2] == want[2], (path, body, headers)
        assert got[1] == want[1], (path, body, headers)
        if headers.get("Host") or headers.get("Accept") or "?format" in path:
            assert served(server, route, lane.DJANGO) == was  # not admitted at all: not even counted
        else:
            assert served(server, route, lane.DJANGO) == was + 1, (path, body)
    assert Run.objects.get(id=run).status == RunStatus.RUNNING
    assert Runner.objects.get(id=runner).status == "busy"


def test_a_body_the_lane_read_reaches_django_whole(server: Server, acme: Organization) -> None:
    # Surrounding spaces are outside ReadySerializer.fast_validate's plain shape: the lane hands the
    # call over with the body it read, and DRF trims them, as it always did.
    deploy(make_stack(acme, "web", {"os": "linux"}))
    _, _, body = call(server, "GET", POLL + "?wait=0", group_token(linux(acme)))
    claim = json.loads(body)
    runner, tok = claim["runner_id"], claim["runner_token"]
    was = served(server, "ready", lane.DJANGO)
    assert call(server, "POST", f"/api/v1/runners/{runner}/ready", tok, {"hostname": "  spaced  "})[0] == 204
    assert served(server, "ready", lane.DJANGO) == was + 1
    assert Runner.objects.get(id=runner).hostname == "spaced"
    # ...and a body over the lane's bound goes to Django unread (the JSON allows the padding).
    padded = json.dumps({"hostname": "again"}).encode() + b" " * (lane.MAX_BODY + 1)
    assert call(server, "POST", f"/api/v1/runners/{runner}/ready", tok, raw=padded)[0] == 204
    assert Runner.objects.get(id=runner).hostname == "again"


def nested(key: str, depth: int = 30_000) -> bytes:
    """``{"key": [[[…]]]}``: deeper than the JSON decoder recurses (about 60 KB, under the lane's body bound)."""
    return b'{"%s": ' % key.encode() + b"[" * depth + b"]" * depth + b"}"


def test_a_bad_body_gets_djangos_answer_from_the_production_server(server: Server, acme: Organization) -> None:
    # Judged by the one strict parser on both paths (gantry.api.parsers.strict_json):
    # the lane hands every body it refuses to Django, whose parser answers it.
    deploy(make_stack(acme, "web", {"os": "linux"}))
    run, runner, tok = accepted(server, linux(acme))
    ready, done, live = f"/api/v1/runners/{runner}/ready", f"/api/v1/runs/{run}/done", f"/api/v1/runs/{run}/logs/live"
    over = b'{"data": "' + b"A" * (4 * 1024 * 1024) + b'"}'  # past DATA_UPLOAD_MAX_MEMORY_SIZE: a JSON 413
    cases: list[tuple[str, str, bytes, int]] = [
        ("ready", ready, nested("hostname"), 400),  # was a 500: RecursionError escaped the lane
        ("done", done, nested("outcome"), 400),
        ("live", live, nested("data"), 400),
        ("ready", ready, b'{"hostname": ' + b"[" * 40 + b"]" * 40 + b"}", 400),  # past jsonsafe's depth
        ("ready", ready, b'{"hostname": "nul\\u0000byte"}', 400),
        ("done", done, b'{"outcome": "succeeded", "error": "nul\\u0000byte"}', 400),
        ("ready", ready, b'{"hostname": "lone\\ud800surrogate"}', 400),
        ("live", live, b'{"chunk_index": 0, "sealed_chunks": 0, "data": "\\udfff"}', 400),
        ("ready", ready, b'{"hostname": "\xff"}', 400),  # not UTF-8
        ("ready", ready, b'{"pid": Infinity}', 400),
        ("live", live, over, 413),
    ]
    for route, path, body, status in cases:
        was = served(server, route, lane.DJANGO)
        got = call(server, "POST", path, tok, raw=body)
        want = django("POST", path, tok, raw=body)
        assert got[0] == want[0] == status, (route, body[:60], got)
        assert got[2] == want[2], (route, body[:60])
        assert got[1] == want[1], (route, body[:60])
        # Read by the lane and handed over (counted), or over its bound and never read (not counted).
        assert served(server, route, lane.DJANGO) == was + (len(body) <= lane.LIVE.max_body), (route, body[:60])
    assert Run.objects.get(id=run).status == RunStatus.RUNNING
    assert "RecursionError" not in server.tail()


def test_with_the_lane_off_django_answers_every_call(acme: Organization, tmp_path: Any) -> None:
    for name in ("web", "api"):
        deploy(make_stack(acme, name, {"os": "linux"}))
    group = linux(acme)
    with asgi_server(tmp_path, GANTRY_FAST_LANE="false") as off:
        steps = lifecycle(lambda *a: call(off, *a), group_token(group))
        assert [status for _, status, _, _ in steps] == [200, 204, 200, 204, 200, 204, 204]
        assert all(served(off, route.name) == 0 for route in lane.ROUTES)
        assert all(served(off, route.name, lane.DJANGO) == 0 for route in lane.ROUTES)


def test_a_live_push_through_the_lane_is_the_record_the_reader_sees(server: Server, acme: Organization) -> None:
    from gantry.logs import live

    deploy(make_stack(acme, "web", {"os": "linux"}))
    run, _, tok = accepted(server, linux(acme))
    was = served(server, "live")
    body = {"chunk_index": 2, "sealed_chunks": 1, "data": base64.b64encode(gzip.compress(b"line\n")).decode()}
    assert call(server, "POST", f"/api/v1/runs/{run}/logs/live", tok, body)[0] == 204
    assert served(server, "live") == was + 1
    record = live.get(uuid.UUID(run))
    assert record is not None
    assert (record.chunk_index, record.sealed_chunks) == (2, 1)
    assert gzip.decompress(record.data) == b"line\n"
    assert record.times is None  # a runner that sends no times


def test_a_live_push_with_line_times_is_served_by_the_lane_and_keeps_them(server: Server, acme: Organization) -> None:
    from gantry.logs import live

    deploy(make_stack(acme, "web", {"os": "linux"}))
    run, _, tok = accepted(server, linux(acme))
    was = served(server, "live")
    data = base64.b64encode(gzip.compress(b"a\nb\n")).decode()
    body = {
        "chunk_index": 0,
        "sealed_chunks": 0,
        "data": data,
        "times": [[0, 1_700_000_000_000], [2, 1_700_000_000_900]],
    }
    assert call(server, "POST", f"/api/v1/runs/{run}/logs/live", tok, body)[0] == 204
    assert served(server, "live") == was + 1
    record = live.get(uuid.UUID(run))
    assert record is not None
    assert record.times == [[0, 1_700_000_000_000], [2, 1_700_000_000_900]]


def test_a_database_error_hands_the_call_to_django_with_nothing_written(acme: Organization) -> None:
    # In this process, on a real failure: another session holds the runner table, and this
    # session's statements give up after 200 ms (QueryCanceled, a DatabaseError).
    import psycopg
    from django.db import connection

    from gantry.dispatch.claim import claim

    deploy(make_stack(acme, "web", {"os": "linux"}))
    won = claim(group=linux(acme))
    assert won is not None
    call_ = lane.Call(ids={"run_id": won.run_id}, token=won.runner_token, query=b"")
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    before = Runner.objects.values_list("last_seen_at", flat=True).get(id=won.runner_id)
    handed = {"route": "status", "outcome": lane.DJANGO}
    was = REGISTRY.get_sample_value("gantry_fast_lane_requests_total", handed) or 0.0
    with psycopg.connect(**params) as other:
        other.execute("LOCK TABLE runner IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cur:
            cur.execute("SET statement_timeout = '200ms'")
        timed = connection.connection
        try:
            assert lane.serve(lane.STATUS, call_) is None
        finally:
            # A session setting outlives the test on that connection, which the lane handed
            # back to the pool: left at 200 ms, a later test's flush (TRUNCATE) is cancelled
            # whenever it waits longer (a busy host), and that test fails in its teardown.
            other.rollback()
            timed.execute("RESET statement_timeout")
    assert REGISTRY.get_sample_value("gantry_fast_lane_requests_total", handed) == was + 1
    assert Runner.objects.values_list("last_seen_at", flat=True).get(id=won.runner_id) == before
    # ...and the same call, the database answering again, is served.
    answer = lane.serve(lane.STATUS, call_)
    assert answer is not None
    assert (answer[0], json.loads(answer[2])) == (200, {"status": "assigned", "cancel_requested": False})


def test_a_thread_keeps_its_connection_between_served_calls_and_returns_it_otherwise(
    acme: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In this process, as a request thread of the server runs the lane.
    from django.db import connection

    from gantry.dispatch.claim import claim

    deploy(make_stack(acme, "web", {"os": "linux"}))
    group = linux(acme)
    won = claim(group=group)
    assert won is not None
    status = lane.Call(ids={"run_id": won.run_id}, token=won.runner_token, query=b"")
    wrong_run = lane.Call(ids={"run_id": uuid.uuid4()}, token=won.runner_token, query=b"")
    monkeypatch.setattr(lane, "STICKY_SECONDS", 5.0)

    answer = lane.serve(lane.STATUS, status)
    assert answer is not None
    assert answer[0] == 200
    kept = connection.connection
    assert kept is not None  # not handed back after a served call
    answer = lane.serve(lane.STATUS, status)
    assert answer is not None
    assert answer[0] == 200
    assert connection.connection is kept  # the next hot call on the thread reuses it

    assert lane.serve(lane.STATUS, wrong_run) is None  # handed to Django: returned at once
    assert connection.connection is None

    assert lane.serve(lane.STATUS, status) is not None
    assert connection.connection is not None
    monkeypatch.setattr(lane, "STICKY_SECONDS", 0.0)  # off (or past its time): returned after the call
    assert lane.serve(lane.STATUS, status) is not None
    assert connection.connection is None

    # The poll's threads keep nothing between attempts, a claim won or not.
    monkeypatch.setattr(lane, "STICKY_SECONDS", 5.0)
    poll = lane.Call(ids={}, token=group_token(group), query=b"wait=0", deferred=asyncpoll.Deferred())
    answer = lane.serve(lane.POLL, poll)
    assert answer is not None
    assert answer[0] == 204
    assert connection.connection is None


def test_connections_stay_with_threads_only_when_the_pool_has_one_for_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings

    monkeypatch.setattr(lane, "STICKY_SECONDS", lane.STICKY_SECONDS)  # restored after the test
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    if isinstance(pool, dict):
        assert lane.allow_sticky_connections(pool["max_size"]) is True
        assert lane.STICKY_SECONDS > 0
    assert lane.allow_sticky_connections(10**6) is False
    assert lane.STICKY_SECONDS == 0


def test_done_through_the_lane_drops_the_live_record_within_the_sweep(server: Server, acme: Organization) -> None:
    from gantry.logs import live

    deploy(make_stack(acme, "web", {"os": "linux"}))
    run, _, tok = accepted(server, linux(acme))
    assert call(server, "POST", f"/api/v1/runs/{run}/logs/live", tok, LIVE)[0] == 204
    assert live.get(uuid.UUID(run)) is not None
    was = served(server, "done")
    assert call(server, "POST", f"/api/v1/runs/{run}/done", tok, DONE)[0] == 204
    assert served(server, "done") == was + 1
    deadline = time.monotonic() + 10 * live.DELETE_SOON_SECONDS
    while live.get(uuid.UUID(run)) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live.get(uuid.UUID(run)) is None


# ---------------------------------------------------------------- a token that names its org: one message


def org_token(group: RunnerGroup, *, version: int | None = None, org: int | None = None) -> str:
    return tokens.mint_group_token(
        group_id=group.id,
        token_version=group.token_version if version is None else version,
        organization_id=group.organization_id if org is None else org,
    )


def test_a_token_naming_its_org_polls_through_the_lane(server: Server, acme: Organization) -> None:
    group = linux(acme)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    was = served(server, "poll")
    steps = lifecycle(lambda *a: call(server, *a), org_token(group))
    assert [status for _, status, _, _ in steps] == [200, 204, 200, 204, 200, 204, 204]
    assert served(server, "poll") == was + 1
    stamp = RunnerGroup.objects.values_list("last_polled_at", flat=True).get(id=group.id)
    assert call(server, "GET", POLL + "?wait=0", org_token(group))[0] == 204  # nothing left: served, stamped
    assert served(server, "poll") == was + 2
    assert RunnerGroup.objects.values_list("last_polled_at", flat=True).get(id=group.id) > stamp


def test_a_refused_org_token_reaches_django_and_its_claim_is_undone(server: Server, acme: Organization) -> None:
    from tests.github.conftest import gha_group, pending_runs

    group, actions = linux(acme), gha_group(acme)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    pending_runs(acme, 1)
    stamps = dict(RunnerGroup.objects.values_list("id", "last_polled_at"))
    rotated = org_token(group)
    services.runner_group_rotate_token(group=group)
    group.refresh_from_db()
    cases = [
        rotated,  # 401: revoked, the claim it rode with rolled back
        org_token(group, org=acme.id + 1000),  # 401: names another org (signed, but not this group's)
        org_token(actions),  # 403 backend_dispatched_group
    ]
    for token in cases:
        was = served(server, "poll", lane.DJANGO)
        got = call(server, "GET", POLL + "?wait=0", token)
        want = django("GET", POLL + "?wait=0", token)
        assert got[0] == want[0] in (401, 403), got
        assert got[2] == want[2]
        assert served(server, "poll", lane.DJANGO) == was + 1
    assert not Runner.objects.exists()  # no stub survived
    assert not Run.objects.filter(status=RunStatus.ASSIGNED).exists()
    assert dict(RunnerGroup.objects.values_list("id", "last_polled_at")) == stamps  # no poll stamped


# ---------------------------------------------------------------- the coordinator's identity on the poll


def test_a_poll_with_identity_headers_is_served_by_the_lane_and_recorded(server: Server, acme: Organization) -> None:
    from gantry import redis as gantry_redis
    from gantry.dispatch import coordinators

    group = linux(acme)
    gantry_redis.client().delete(coordinators.key_for(group.id))  # group ids repeat from test to test
    who = {
        "X-Gantry-Coordinator-Id": "c-lane-1",
        "X-Gantry-Coordinator-Host": "ci-7.example",
        "X-Gantry-Coordinator-Version": "0.1.0",
    }
    was = served(server, "poll")

    assert call(server, "GET", POLL + "?wait=0", org_token(group), headers=who)[0] == 204

    assert served(server, "poll") == was + 1  # the lane took it, headers and all
    found = (coordinators.of_groups([group.id]) or {})[group.id]
    assert [(c.id, c.host, c.version) for c in found] == [("c-lane-1", "ci-7.example", "0.1.0")]
    # A malformed one is the view's 400, with its body; nothing more is recorded.
    bad = {**who, "X-Gantry-Coordinator-Id": "two words"}
    got, want = (
        call(server, "GET", POLL + "?wait=0", org_token(group), headers=bad),
        django("GET", POLL + "?wait=0", org_token(group), headers=bad),
    )
    assert got[0] == want[0] == 400
    assert got[2] == want[2]
    assert len((coordinators.of_groups([group.id]) or {})[group.id]) == 1
