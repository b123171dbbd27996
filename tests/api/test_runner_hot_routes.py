"""The runner routes on their fast paths (docs/performance.md, "Runner routes"): same answers, same writes.

Authentication reads one row through a prepared statement, /status folds the
runner check into its own statement, accept and done are single prepared
transitions, and the common bodies skip their serializers. Each test drives
the real routes and checks what the slow paths guaranteed: revocation, the
run binding, refusals that change nothing, and every event and lane move.
Some run in autocommit (``transaction=True``), where the statements open and
commit their own transactions, as under the server.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from gantry.api.auth import BearerJWTAuthentication
from gantry.core import services, tokens
from gantry.core.models import Deployment, Run, RunEvent, Runner, RunnerGroup, RunToken, Stack
from gantry.sql import statement


def _bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _claim(group: RunnerGroup) -> tuple[str, str, str]:
    """(run, runner, runner token) of a claim made through the poll route."""
    token = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    answer = _bearer(token).get("/api/v1/runner-groups/poll?wait=0")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    return body["run_id"], body["runner_id"], body["runner_token"]


def _accepted(group: RunnerGroup, stack: Stack) -> tuple[str, str, APIClient]:
    services.deployment_create(stack=stack)
    run, runner, token = _claim(group)
    client = _bearer(token)
    assert client.post(f"/api/v1/runners/{runner}/ready", {"hostname": "h1"}, format="json").status_code == 204
    assert client.post(f"/api/v1/runs/{run}/accept").status_code == 200
    return run, runner, client


def _seen(runner: str) -> Any:
    return Runner.objects.values_list("last_seen_at", flat=True).get(id=runner)


# ---------------------------------------------------------------- authentication


def test_it_refuses_a_rotated_group_token_on_the_group_routes(group: RunnerGroup) -> None:
    old = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    new = services.runner_group_rotate_token(group=group)
    for path in ("/api/v1/runner-groups/poll?wait=0", "/api/v1/runner-groups/demand"):
        refused = _bearer(old).get(path)
        assert refused.status_code == 401, path
        assert refused.json() == {
            "code": "authentication_failed",
            "detail": "runner group token is revoked or its group is gone",
        }
        assert refused["WWW-Authenticate"] == "Bearer"
        assert _bearer(new).get(path).status_code in (200, 204), path


def test_it_refuses_a_group_token_once_its_group_is_deleted(group: RunnerGroup) -> None:
    token = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    RunnerGroup.objects.filter(id=group.id).delete()
    assert _bearer(token).get("/api/v1/runner-groups/poll?wait=0").status_code == 401


def test_it_hands_the_group_routes_a_whole_group(group: RunnerGroup, stack: Stack) -> None:
    # The poll's claim reads the group the authentication built from one row.
    services.deployment_create(stack=stack)
    run, runner, _ = _claim(group)
    assert Run.objects.get(id=run).assigned_runner_id == uuid.UUID(runner)
    assert Runner.objects.get(id=runner).runner_group_id == group.id


def test_it_hands_the_group_with_its_organization_loaded(group: RunnerGroup, django_assert_num_queries: Any) -> None:
    token = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    request = Request(APIRequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {token}"))
    authenticated = BearerJWTAuthentication().authenticate(request)
    assert authenticated is not None
    principal = authenticated[0]
    with django_assert_num_queries(0):  # as select_related gave it: an async handler may read it
        assert principal.group.organization.slug == "acme"
        assert principal.group.labels == group.labels
        assert principal.group.token_version == group.token_version


@pytest.mark.parametrize("route", ["ready", "accept", "status", "done", "live", "deregister"])
def test_it_refuses_every_runner_route_once_the_runner_is_gone(group: RunnerGroup, stack: Stack, route: str) -> None:
    run, runner, client = _accepted(group, stack)
    Run.objects.filter(id=run).update(assigned_runner=None)  # let the row go without the FK's help
    Runner.objects.filter(id=runner).delete()
    calls = {
        "ready": ("post", f"/api/v1/runners/{runner}/ready", {}),
        "accept": ("post", f"/api/v1/runs/{run}/accept", None),
        "status": ("get", f"/api/v1/runs/{run}/status", None),
        "done": ("post", f"/api/v1/runs/{run}/done", {"outcome": "succeeded", "exit_code": 0}),
        "live": ("post", f"/api/v1/runs/{run}/logs/live", {"chunk_index": 0, "sealed_chunks": 0, "data": "H4sI"}),
        "deregister": ("delete", f"/api/v1/runners/{runner}/deregister", None),
    }
    method, path, body = calls[route]
    answer = getattr(client, method)(path, body, format="json") if body is not None else getattr(client, method)(path)
    assert answer.status_code == 401
    assert answer.json() == {"code": "authentication_failed", "detail": "runner no longer exists"}
    assert answer["WWW-Authenticate"] == "Bearer"
    assert Run.objects.get(id=run).status == "running"


def test_it_refuses_a_runner_token_whose_group_claim_is_another_group(
    group: RunnerGroup, stack: Stack, globex: Any
) -> None:
    run, runner, _ = _accepted(group, stack)
    other, _ = services.runner_group_create(org=globex, name="other")
    forged = tokens.mint_runner_token(runner_id=uuid.UUID(runner), run_id=uuid.UUID(run), group_id=other.id)
    before = _seen(runner)
    for path in (f"/api/v1/runs/{run}/status", f"/api/v1/runs/{run}/accept"):
        method = "get" if path.endswith("status") else "post"
        assert getattr(_bearer(forged), method)(path).status_code == 401, path
    assert _seen(runner) == before


# ---------------------------------------------------------------- /status in one statement


def test_it_answers_status_and_refreshes_liveness(group: RunnerGroup, stack: Stack) -> None:
    run, runner, client = _accepted(group, stack)
    Runner.objects.filter(id=runner).update(last_seen_at=None)
    answer = client.get(f"/api/v1/runs/{run}/status")
    assert answer.status_code == 200
    assert answer.json() == {"status": "running", "cancel_requested": False}
    assert _seen(runner) is not None
    services.run_request_cancellation(run_id=uuid.UUID(run))
    assert client.get(f"/api/v1/runs/{run}/status").json() == {
        "status": "requested_cancellation",
        "cancel_requested": True,
    }


def test_a_heartbeat_is_a_heap_only_update(group: RunnerGroup, stack: Stack) -> None:
    # No index covers last_seen_at (migration 0016), so /status writes no index
    # entry: PostgreSQL counts the update as HOT. Read within this transaction.
    run, _, client = _accepted(group, stack)
    with connection.cursor() as cur:
        counts = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'runner'"
        cur.execute(counts)
        updated, hot = cur.fetchone()
        assert client.get(f"/api/v1/runs/{run}/status").status_code == 200
        cur.execute(counts)
        assert cur.fetchone() == (updated + 1, hot + 1)


def test_it_refuses_status_for_another_run_and_writes_nothing(group: RunnerGroup, stack: Stack) -> None:
    _run, runner, client = _accepted(group, stack)
    Runner.objects.filter(id=runner).update(last_seen_at=None)
    other = uuid.uuid4()
    answer = client.get(f"/api/v1/runs/{other}/status")
    assert answer.status_code == 403
    assert answer.json()["code"] == "run_binding"
    assert _seen(runner) is None


def test_it_answers_401_before_403_for_a_gone_runner_on_another_run(group: RunnerGroup, stack: Stack) -> None:
    run, runner, client = _accepted(group, stack)
    Run.objects.filter(id=run).update(assigned_runner=None)
    Runner.objects.filter(id=runner).delete()
    assert client.get(f"/api/v1/runs/{uuid.uuid4()}/status").status_code == 401


def test_it_answers_404_for_a_runs_status_once_the_run_is_gone(group: RunnerGroup) -> None:
    runner = Runner.objects.create(runner_group=group)
    run = uuid.uuid4()
    token = tokens.mint_runner_token(runner_id=runner.id, run_id=run, group_id=group.id)
    answer = _bearer(token).get(f"/api/v1/runs/{run}/status")
    assert answer.status_code == 404
    assert answer.json() == {"code": "not_found", "detail": "run not found"}


def test_it_refuses_a_group_token_on_status(group: RunnerGroup, stack: Stack) -> None:
    run, _, _ = _accepted(group, stack)
    token = tokens.mint_group_token(group_id=group.id, token_version=group.token_version)
    answer = _bearer(token).get(f"/api/v1/runs/{run}/status")
    assert answer.status_code == 403
    assert answer.json()["code"] == "forbidden"


# ---------------------------------------------------------------- accept and done, in autocommit


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_lifecycle_with_every_event_and_the_lane_moving(group: RunnerGroup, stack: Stack) -> None:
    first = services.deployment_create(stack=stack)
    second = services.deployment_create(stack=stack)  # queued behind the first on the stack's lane
    run, runner, token = _claim(group)
    client = _bearer(token)
    assert (
        client.post(f"/api/v1/runners/{runner}/ready", {"hostname": "h1", "pid": 7}, format="json").status_code == 204
    )
    accepted = client.post(f"/api/v1/runs/{run}/accept")
    assert accepted.status_code == 200
    context = accepted.json()
    assert context["spec"] == stack.spec
    assert context["run_id"] == run
    assert context["secrets"] == {}
    assert Deployment.objects.get(id=first.id).status == "running"
    assert Runner.objects.get(id=runner).status == "busy"
    assert RunToken.objects.get(run_id=run).token_sha256 == tokens.sha256_hex(context["api_token"])
    assert client.get(f"/api/v1/runs/{run}/status").json()["status"] == "running"
    done = {"outcome": "succeeded", "exit_code": 0, "sealed_chunks": 1, "manifest": {"count": 1, "sha256": ["a" * 64]}}
    assert client.post(f"/api/v1/runs/{run}/done", done, format="json").status_code == 204
    finished = Run.objects.get(id=run)
    assert (finished.status, finished.exit_code, finished.sealed_chunks) == ("succeeded", 0, 1)
    assert finished.log_manifest == {"count": 1, "sha256": ["a" * 64]}
    assert finished.finished_at is not None
    assert finished.assigned_expires_at is None
    assert RunToken.objects.get(run_id=run).revoked_at is not None
    assert Deployment.objects.get(id=first.id).status == "succeeded"
    kinds = list(RunEvent.objects.filter(run_id=run).order_by("at", "id").values_list("kind", flat=True))
    assert kinds == ["created", "assigned", "accepted", "finished"]
    assert RunEvent.objects.get(run_id=run, kind="finished").detail == {"outcome": "succeeded", "exit_code": 0}
    assert RunEvent.objects.get(run_id=run, kind="accepted").detail == {"runner_id": runner}
    nxt = second.runs.get()
    assert nxt.status == "pending"
    assert nxt.first_pending_at is not None
    assert RunEvent.objects.filter(run_id=nxt.id, kind="promoted").count() == 1
    # A replay of /done (its answer lost) is accepted and changes nothing.
    assert client.post(f"/api/v1/runs/{run}/done", done, format="json").status_code == 204
    assert RunEvent.objects.filter(run_id=run, kind="finished").count() == 1
    assert client.delete(f"/api/v1/runners/{runner}/deregister").status_code == 204
    assert not Runner.objects.filter(id=runner).exists()


@pytest.mark.django_db(transaction=True)
def test_it_refuses_done_from_a_runner_that_does_not_hold_the_run(group: RunnerGroup, stack: Stack) -> None:
    run, _runner, client = _accepted(group, stack)
    services.run_request_cancellation(run_id=uuid.UUID(run))
    # succeeded is allowed from requested_cancellation; cancelled needs it: both guarded on the runner.
    intruder = Runner.objects.create(runner_group=group)
    token = tokens.mint_runner_token(runner_id=intruder.id, run_id=uuid.UUID(run), group_id=group.id)
    answer = _bearer(token).post(f"/api/v1/runs/{run}/done", {"outcome": "cancelled"}, format="json")
    assert answer.status_code == 409
    assert Run.objects.get(id=run).status == "requested_cancellation"
    assert RunEvent.objects.filter(run_id=run, kind="finished").count() == 0
    assert client.post(f"/api/v1/runs/{run}/done", {"outcome": "cancelled"}, format="json").status_code == 204
    assert Run.objects.get(id=run).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_second_accept_and_fails_the_run(group: RunnerGroup, stack: Stack) -> None:
    run, _, client = _accepted(group, stack)
    again = client.post(f"/api/v1/runs/{run}/accept")
    assert again.status_code == 409
    assert again.json()["code"] == "accept_response_undeliverable"
    assert Run.objects.get(id=run).status == "failure"


# ---------------------------------------------------------------- the token's group folded into the statement


def test_the_hot_edges_change_nothing_for_a_runner_of_another_group(
    group: RunnerGroup, stack: Stack, globex: Any
) -> None:
    # gantry.server.lane skips the separate authentication read: each edge's
    # own statement checks the token's group, and refuses with nothing
    # written when the runner is not of it.
    from django.utils import timezone

    other, _ = services.runner_group_create(org=globex, name="other")
    services.deployment_create(stack=stack)
    run_id, runner_id, _ = _claim(group)
    run, runner = uuid.UUID(run_id), uuid.UUID(runner_id)
    now = timezone.now()

    def drive(plan: Any) -> Any:
        return statement.drive(plan)

    ready = {"metadata": {"hostname": "x"}, "now": now}
    assert drive(services.ready_plan(runner_id=runner, group_id=other.id, **ready)) is None
    assert Runner.objects.get(id=runner).status == "not_ready"
    assert drive(services.ready_plan(runner_id=runner, group_id=group.id, metadata={"hostname": "h"}, now=now)) == (
        "not_ready"  # the state it judged
    )
    assert Runner.objects.get(id=runner).hostname == "h"

    refused = drive(services.accept_plan(run_id=run, runner_id=runner, group_id=other.id, now=now))
    assert isinstance(refused, services.Refused)
    assert refused.state.refused == "group"
    assert Run.objects.get(id=run).status == "assigned"
    assert not RunToken.objects.filter(run_id=run).exists()
    accepted = drive(services.accept_plan(run_id=run, runner_id=runner, group_id=group.id, now=now))
    assert not isinstance(accepted, services.Refused)
    assert accepted[0].status == "running"

    done = {"report": {"outcome": "succeeded", "exit_code": 0}, "now": now}
    refused = drive(services.finish_plan(run_id=run, runner_id=runner, group_id=other.id, **done))
    assert isinstance(refused, services.Refused)
    assert Run.objects.get(id=run).status == "running"
    assert not RunEvent.objects.filter(run_id=run, kind="finished").exists()
    finished = drive(services.finish_plan(run_id=run, runner_id=runner, group_id=group.id, **done))
    assert not isinstance(finished, services.Refused)
    assert finished.status == "succeeded"

    assert drive(services.deregister_plan(runner_id=runner, group_id=other.id, now=now)) == (False, False, False)
    assert Runner.objects.filter(id=runner).exists()
    assert drive(services.deregister_plan(runner_id=runner, group_id=group.id, now=now)) == (True, False, True)
    assert not Runner.objects.filter(id=runner).exists()
