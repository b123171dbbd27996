"""Priority through the API: on a deployment, on a stack, and a waiting run's change (docs/queue.md, docs/api.md)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from gantry.core.models import Deployment, Organization, Priority, Run, RunnerGroup, Stack
from gantry.dispatch.claim import claim

pytestmark = pytest.mark.django_db


def deploy(api: APIClient, stack: Stack, **body: object) -> tuple[int, dict]:
    response = api.post(f"/api/v1/stacks/{stack.id}/deployments", body, format="json")
    return response.status_code, response.json()


def test_a_member_may_queue_low_and_normal(teammate_api: APIClient, stack: Stack) -> None:
    for name in ("low", "normal"):
        code, body = deploy(teammate_api, stack, priority=name)
        assert code == 201, body
        assert body["run"]["priority"] == name
        assert Run.objects.get(id=body["run"]["id"]).priority == Priority.named(name)


def test_a_members_high_is_403_priority_forbidden_and_queues_nothing(teammate_api: APIClient, stack: Stack) -> None:
    code, body = deploy(teammate_api, stack, priority="high")
    assert code == 403
    assert body["code"] == "priority_forbidden"
    assert not Deployment.objects.filter(stack=stack).exists()


def test_an_admins_high_run_carries_it_in_every_answer(
    owner_api: APIClient, teammate_api: APIClient, stack: Stack
) -> None:
    code, body = deploy(owner_api, stack, priority="high")
    assert code == 201, body
    run_id = body["run"]["id"]
    assert teammate_api.get(f"/api/v1/runs/{run_id}").json()["priority"] == "high"
    listed = teammate_api.get("/api/v1/orgs/acme/runs").json()["runs"]
    assert [r["priority"] for r in listed if r["id"] == run_id] == ["high"]
    queued = teammate_api.get("/api/v1/orgs/acme/queue").json()["runs"]
    assert [r["priority"] for r in queued if r["id"] == run_id] == ["high"]


@pytest.mark.parametrize("value", ["urgent", "HIGH", 2, None, ["high"], ""])
def test_an_unknown_priority_is_400_and_queues_nothing(owner_api: APIClient, stack: Stack, value: object) -> None:
    code, body = deploy(owner_api, stack, priority=value)
    assert code == 400, body
    assert body["code"] == "invalid_request"
    assert not Deployment.objects.filter(stack=stack).exists()


def test_a_deployment_without_priority_takes_the_stacks_default(
    owner_api: APIClient, teammate_api: APIClient, stack: Stack
) -> None:
    response = owner_api.patch(f"/api/v1/stacks/{stack.id}", {"default_priority": "high"}, format="json")
    assert response.status_code == 200
    assert response.json()["default_priority"] == "high"
    # The admin chose it for the stack: a member's deployment that names none gets it.
    code, body = deploy(teammate_api, stack)
    assert code == 201
    assert body["run"]["priority"] == "high"
    # Naming one still wins.
    code, body = deploy(teammate_api, stack, priority="low")
    assert body["run"]["priority"] == "low"


def test_a_stack_is_created_with_a_default_priority(owner_api: APIClient) -> None:
    response = owner_api.post("/api/v1/orgs/acme/stacks", {"name": "batch", "default_priority": "low"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["default_priority"] == "low"
    assert Stack.objects.get(name="batch").default_priority == Priority.LOW
    plain = owner_api.post("/api/v1/orgs/acme/stacks", {"name": "plain"}, format="json").json()
    assert plain["default_priority"] == "normal"
    bad = owner_api.post("/api/v1/orgs/acme/stacks", {"name": "bad", "default_priority": "asap"}, format="json")
    assert bad.status_code == 400
    assert not Stack.objects.filter(name="bad").exists()


# ---------------------------------------------------------------- PATCH /runs/{id}


def test_an_admin_changes_a_waiting_runs_priority(owner_api: APIClient, stack: Stack) -> None:
    _, body = deploy(owner_api, stack)
    run_id = body["run"]["id"]
    response = owner_api.patch(f"/api/v1/runs/{run_id}", {"priority": "high"}, format="json")
    assert response.status_code == 200, response.json()
    answer = response.json()
    assert answer["priority"] == "high"
    assert [e["detail"] for e in answer["events"] if e["kind"] == "priority_changed"] == [
        {"from": "normal", "to": "high", "by": "owner"}
    ]


def test_a_member_may_not_change_a_runs_priority(owner_api: APIClient, teammate_api: APIClient, stack: Stack) -> None:
    _, body = deploy(owner_api, stack)
    response = teammate_api.patch(f"/api/v1/runs/{body['run']['id']}", {"priority": "low"}, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "priority_forbidden"
    assert Run.objects.get(id=body["run"]["id"]).priority == Priority.NORMAL


def test_another_orgs_admin_sees_no_run(owner_api: APIClient, globex_stack: Stack, outsider_api: APIClient) -> None:
    run = Run.objects.get(deployment_id=deploy(outsider_api, globex_stack)[1]["id"])
    response = owner_api.patch(f"/api/v1/runs/{run.id}", {"priority": "high"}, format="json")
    assert response.status_code == 404
    assert Run.objects.get(id=run.id).priority == Priority.NORMAL


def test_a_claimed_run_is_409_run_not_waiting(owner_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    _, body = deploy(owner_api, stack, priority="low")
    assert claim(group=group) is not None
    response = owner_api.patch(f"/api/v1/runs/{body['run']['id']}", {"priority": "high"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "run_not_waiting"
    assert response.json()["status"] == "assigned"
    assert Run.objects.get(id=body["run"]["id"]).priority == Priority.LOW


@pytest.mark.parametrize("payload", [{}, {"priority": "soon"}, {"priority": 1}, {"status": "pending"}])
def test_a_bad_change_is_400_and_changes_nothing(owner_api: APIClient, stack: Stack, payload: dict) -> None:
    _, body = deploy(owner_api, stack, priority="low")
    response = owner_api.patch(f"/api/v1/runs/{body['run']['id']}", payload, format="json")
    assert response.status_code == 400
    assert Run.objects.get(id=body["run"]["id"]).priority == Priority.LOW


def test_the_retry_route_keeps_the_priority(owner_api: APIClient, stack: Stack, acme: Organization) -> None:
    _, body = deploy(owner_api, stack, priority="high")
    owner_api.post(f"/api/v1/runs/{body['run']['id']}/cancel")
    retried = owner_api.post(f"/api/v1/deployments/{body['id']}/retry").json()
    assert retried["run"]["priority"] == "high"
    assert retried["run"]["id"] != body["run"]["id"]
