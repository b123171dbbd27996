"""The fast lane's one-statement calls on the event loop (gantry.server.lanedb, GANTRY_FAST_LANE_LOOP).

Under gantry.asgi, status, ready, accept, done and deregister run their plans
(gantry.sql.statement) on asyncio connections of the loop's own pool instead
of on a request thread. The same plans run on Django's connection there and
in every sync caller; these tests hold the two drivers to the same answers and
the same writes, and the loop's pool to its failure rules: a database error
hands the call to Django with nothing written, and a connection the server
dropped is replaced before a call uses it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest
from django.db import connection
from prometheus_client import REGISTRY

from gantry import conf
from gantry.core.models import Organization, Run, Runner, RunStatus
from gantry.dispatch.claim import Claim, claim
from gantry.server import lane, lanedb
from gantry.sql import runners as runner_sql
from tests.asgi.server import asgi_server
from tests.asgi.test_fast_lane import call, group_token, lifecycle, linux, served, shape
from tests.dispatch.helpers import deploy, make_stack
from tests.dispatch.test_claim_transaction import wire

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
READY = {"hostname": "h1", "launcher": "local", "pid": 42}
DONE = {"outcome": "succeeded", "exit_code": 0}


def on_a_loop(work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` on a fresh event loop, as a server's worker would, closing the loop's lane pool after it."""

    async def main() -> T:
        try:
            return await work()
        finally:
            await lanedb.close()

    return asyncio.run(main())


def other_session() -> dict[str, Any]:
    """Parameters for a plain psycopg session on the test database (beside Django's and the lane's)."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def body(raw: dict[str, Any]) -> bytes:
    return json.dumps(raw).encode()


def test_the_loop_and_the_threads_answer_every_hot_call_alike(acme: Organization, tmp_path: Any) -> None:
    group = linux(acme)
    for name in ("web", "api"):
        deploy(make_stack(acme, name, {"os": "linux"}))
    replies = {}
    for on_loop in ("true", "false"):
        with asgi_server(tmp_path, GANTRY_FAST_LANE_LOOP=on_loop) as server:
            before = {route.name: served(server, route.name) for route in lane.ROUTES}
            replies[on_loop] = lifecycle(lambda *a, s=server: call(s, *a), group_token(group))
            after = {route.name: served(server, route.name) for route in lane.ROUTES}
            assert {n: after[n] - before[n] for n in after} == dict.fromkeys(after, 1.0), on_loop
    for (name, status, headers, got), (_, want_status, want_headers, want) in zip(
        replies["true"], replies["false"], strict=True
    ):
        assert status == want_status, name
        assert {k: v for k, v in headers.items() if k != "content-length"} == {
            k: v for k, v in want_headers.items() if k != "content-length"
        }, name
        assert shape(got) == shape(want), name
    assert Run.objects.filter(organization=acme, status=RunStatus.SUCCEEDED).count() == 2
    assert not Runner.objects.filter(runner_group=group).exists()


def test_a_lifecycle_on_the_loop_writes_what_the_orm_reads(acme: Organization) -> None:
    deploy(make_stack(acme, "web", {"os": "linux"}))
    won = claim(group=linux(acme))
    assert won is not None
    run, runner, tok = won.run_id, won.runner_id, won.runner_token

    def through_lane(route: lane.Route, ids: dict[str, uuid.UUID], raw: bytes = b"") -> Callable[[], Awaitable[Any]]:
        return lambda: lane.aserve(route, lane.Call(ids=ids, token=tok, query=b"", body=raw))

    async def steps() -> list[Any]:
        out = []
        for route, ids, raw in [
            (lane.READY, {"runner_id": runner}, body(READY)),
            (lane.ACCEPT, {"run_id": run}, b""),
            (lane.STATUS, {"run_id": run}, b""),
            (lane.DONE, {"run_id": run}, body(DONE)),
            (lane.DEREGISTER, {"runner_id": runner}, b""),
        ]:
            out.append(await through_lane(route, ids, raw)())
        return out

    answers = on_a_loop(steps)
    assert [a[0] if a else None for a in answers] == [204, 200, 200, 204, 204]
    context = json.loads(answers[1][2])
    assert context["run_id"] == str(run)
    assert context["api_token"]
    assert json.loads(answers[2][2]) == {"status": "running", "cancel_requested": False}
    done = Run.objects.get(id=run)
    assert (done.status, done.exit_code, done.assigned_runner_id) == (RunStatus.SUCCEEDED, 0, None)
    assert list(done.events.order_by("at", "id").values_list("kind", flat=True))[-2:] == ["accepted", "finished"]
    assert not Runner.objects.filter(id=runner).exists()


def test_a_call_the_plan_refuses_on_the_loop_goes_to_django_having_written_nothing(acme: Organization) -> None:
    deploy(make_stack(acme, "web", {"os": "linux"}))
    won = claim(group=linux(acme))
    assert won is not None
    handed = {"route": "accept", "outcome": lane.DJANGO}
    was = REGISTRY.get_sample_value("gantry_fast_lane_requests_total", handed) or 0.0
    # Not ready yet is fine for accept; another run's id in the path is not.
    wrong = lane.Call(ids={"run_id": uuid.uuid4()}, token=won.runner_token, query=b"")
    forged = lane.Call(ids={"run_id": won.run_id}, token=won.runner_token + "x", query=b"")
    assert on_a_loop(lambda: lane.aserve(lane.ACCEPT, wrong)) is None
    assert on_a_loop(lambda: lane.aserve(lane.ACCEPT, forged)) is None
    assert REGISTRY.get_sample_value("gantry_fast_lane_requests_total", handed) == was + 2
    assert Run.objects.get(id=won.run_id).status == RunStatus.ASSIGNED


def one_pool_connection_and_a_claim(acme: Organization, monkeypatch: pytest.MonkeyPatch) -> tuple[Claim, lane.Call]:
    """One connection in the loop's pool (so the session a test acts on is the one the next call gets), and the
    runner's /status call for a claimed run."""
    server = dataclasses.replace(conf.server(), lane_db_pool_max=1)  # GANTRY_LANE_DB_POOL_MAX=1
    monkeypatch.setattr(conf, "server", lambda: server)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    won = claim(group=linux(acme))
    assert won is not None
    return won, lane.Call(ids={"run_id": won.run_id}, token=won.runner_token, query=b"")


def test_a_database_error_on_the_loop_hands_the_call_to_django_with_nothing_written(
    acme: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    won, status = one_pool_connection_and_a_claim(acme, monkeypatch)
    before = Runner.objects.values_list("last_seen_at", flat=True).get(id=won.runner_id)
    params = other_session()
    handed = {"route": "status", "outcome": lane.DJANGO}
    was = REGISTRY.get_sample_value("gantry_fast_lane_requests_total", handed) or 0.0
    seen = "SELECT last_seen_at FROM runner WHERE id = %s"

    async def work() -> tuple[Any, Any, Any]:
        async with lanedb.connection() as conn:
            await conn.execute("SET statement_timeout = '200ms'")
        with psycopg.connect(**params) as other:
            other.execute("LOCK TABLE runner IN ACCESS EXCLUSIVE MODE")
            try:
                refused = await lane.aserve(lane.STATUS, status)
            finally:
                other.rollback()
            stamp = other.execute(seen, [won.runner_id]).fetchone()
        return refused, stamp, await lane.aserve(lane.STATUS, status)

    refused, stamp, again = on_a_loop(work)
    assert refused is None
    assert stamp == (before,)  # the heartbeat was not written
    assert REGISTRY.get_sample_value("gantry_fast_lane_requests_total", handed) == was + 1
    assert again is not None  # the database answering again, the same call is served
    assert (again[0], json.loads(again[2])) == (200, {"status": "assigned", "cancel_requested": False})
    assert Runner.objects.values_list("last_seen_at", flat=True).get(id=won.runner_id) != before


def test_a_connection_the_server_dropped_is_replaced_before_a_call_uses_it(
    acme: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, status = one_pool_connection_and_a_claim(acme, monkeypatch)
    params = other_session()

    async def work() -> tuple[Any, int, int]:
        first = await lane.aserve(lane.STATUS, status)
        assert first is not None
        assert first[0] == 200
        async with lanedb.connection() as conn:
            dropped = conn.info.backend_pid
        # (Django's connection is not for use on an event loop: a session of its own.)
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [dropped])
            for _ in range(100):  # until the server has closed it (its socket turns readable)
                gone = other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [dropped]).fetchone()
                if gone == (0,):
                    break
                await asyncio.sleep(0.02)
        answer = await lane.aserve(lane.STATUS, status)
        async with lanedb.connection() as conn:
            now_pid = conn.info.backend_pid
        return answer, dropped, now_pid

    answer, dropped, now_pid = on_a_loop(work)
    assert answer is not None
    assert answer[0] == 200
    assert now_pid != dropped


def test_a_call_on_the_loop_is_one_message_and_a_healthy_connection_leaves_the_pool_unqueried(
    acme: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, status = one_pool_connection_and_a_claim(acme, monkeypatch)

    async def work() -> tuple[Any, list[tuple[str, str]]]:
        warm = await lane.aserve(lane.STATUS, status)  # prepares the statement on the session
        assert warm is not None
        async with lanedb.connection() as conn:
            pgconn = conn.pgconn
        with wire(pgconn) as sent:
            answer = await lane.aserve(lane.STATUS, status)
        return answer, sent

    answer, sent = on_a_loop(work)
    assert answer is not None
    assert answer[0] == 200
    # The pool's check sent nothing (the socket had nothing to read); the call, one simple-query message.
    assert [kind for kind, _ in sent] == ["Query"], sent
    assert re.fullmatch(
        rf'"BEGIN; SET LOCAL synchronous_commit = off; EXECUTE {runner_sql.STATUS.name} \(.*\); COMMIT"', sent[0][1]
    ), sent
