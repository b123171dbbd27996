"""The user and admin calls: answer shapes, validation, and the 409s of the contract."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import Deployment, Membership, Organization, Run, RunEvent, RunnerGroup, Stack

from ..conftest import SPEC

# ---------------------------------------------------------------- orgs


def test_it_creates_an_org_as_superuser(root_api: APIClient) -> None:
    response = root_api.post("/api/v1/orgs", {"slug": "initech", "name": "Initech"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["slug"] == "initech"
    # New orgs start at 2 runs/hour: the column default.
    assert body["runs_per_hour_limit"] == 2
    assert body["default_runner_group_id"] is None
    assert root_api.post("/api/v1/orgs", {"slug": "initech", "name": "X"}, format="json").json()["code"] == "slug_taken"


def test_it_refuses_org_creation_to_others(owner_api: APIClient) -> None:
    assert owner_api.post("/api/v1/orgs", {"slug": "x", "name": "X"}, format="json").status_code == 403
    assert not Organization.objects.filter(slug="x").exists()


@pytest.mark.parametrize("body", [{}, {"slug": "has space", "name": "x"}, {"slug": "ok"}, {"slug": ["a"], "name": "x"}])
def test_it_rejects_bad_org_input(root_api: APIClient, body: dict[str, Any]) -> None:
    response = root_api.post("/api/v1/orgs", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert Organization.objects.count() == 0


def test_it_lists_only_my_orgs(owner_api: APIClient, globex: Organization, root_api: APIClient) -> None:
    assert [o["slug"] for o in owner_api.get("/api/v1/orgs").json()] == ["acme"]
    assert [o["slug"] for o in root_api.get("/api/v1/orgs").json()] == ["acme", "globex"]


def test_it_sets_the_default_group_of_my_org_only(
    owner_api: APIClient, group: RunnerGroup, globex: Organization
) -> None:
    response = owner_api.patch("/api/v1/orgs/acme", {"default_runner_group_id": group.id}, format="json")
    assert response.status_code == 200
    assert response.json()["default_runner_group_id"] == group.id
    foreign, _ = services.runner_group_create(org=globex, name="theirs")
    response = owner_api.patch("/api/v1/orgs/acme", {"default_runner_group_id": foreign.id}, format="json")
    assert response.status_code == 400
    assert Organization.objects.get(slug="acme").default_runner_group_id == group.id
    # The rate is read-only here: the field is ignored, not applied.
    owner_api.patch("/api/v1/orgs/acme", {"runs_per_hour_limit": 999}, format="json")
    assert Organization.objects.get(slug="acme").runs_per_hour_limit == 2


def test_it_clears_the_throttle_stamp_with_the_rate(root_api: APIClient, acme: Organization) -> None:
    from django.utils import timezone

    Organization.objects.filter(id=acme.id).update(dispatch_throttled_until=timezone.now())
    response = root_api.put("/api/v1/orgs/acme/runs-per-hour-limit", {"runs_per_hour_limit": 60}, format="json")
    assert response.status_code == 200
    acme.refresh_from_db()
    assert (acme.runs_per_hour_limit, acme.dispatch_throttled_until) == (60, None)
    bad = root_api.put("/api/v1/orgs/acme/runs-per-hour-limit", {"runs_per_hour_limit": -1}, format="json")
    assert bad.status_code == 400
    assert root_api.put("/api/v1/orgs/nope/runs-per-hour-limit", {"runs_per_hour_limit": 1}).status_code == 404


# ---------------------------------------------------------------- members


def test_it_adds_a_new_member_with_a_token(owner_api: APIClient, acme: Organization) -> None:
    response = owner_api.post("/api/v1/orgs/acme/members", {"username": "dana", "role": "member"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["role"] == "member"
    assert Token.objects.get(user__username="dana").key == body["token"]
    # The token works for member calls straight away.
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {body['token']}")
    assert client.get("/api/v1/orgs/acme").status_code == 200


def test_it_changes_a_members_role_without_a_new_token(owner_api: APIClient, teammate: User) -> None:
    response = owner_api.post("/api/v1/orgs/acme/members", {"username": "teammate", "role": "admin"}, format="json")
    assert response.status_code == 200
    assert "token" not in response.json()
    assert Membership.objects.get(user=teammate).role == "admin"
    listed = owner_api.get("/api/v1/orgs/acme/members").json()
    assert {"username": "teammate", "role": "admin"} in listed


def test_it_invites_an_existing_user_of_another_org_instead_of_attaching_them(
    owner_api: APIClient, outsider: User
) -> None:
    response = owner_api.post("/api/v1/orgs/acme/members", {"username": "outsider", "role": "member"}, format="json")
    assert response.status_code == 202
    assert response.json()["status"] == "invited"
    assert "token" not in response.json()
    # Not a member until they accept (tests/api/test_members.py).
    assert Membership.objects.filter(user=outsider).count() == 1


def test_it_rejects_a_bad_role(owner_api: APIClient) -> None:
    response = owner_api.post("/api/v1/orgs/acme/members", {"username": "x", "role": "owner"}, format="json")
    assert response.status_code == 400
    assert not User.objects.filter(username="x").exists()


# ---------------------------------------------------------------- runner groups


def test_it_creates_a_group_and_shows_its_token_once(owner_api: APIClient) -> None:
    response = owner_api.post(
        "/api/v1/orgs/acme/runner-groups", {"name": "gpu", "labels": {"gpu": "a100"}}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    assert (body["kind"], body["max_concurrent_runs"], body["drained"]) == ("self_hosted", 10, False)
    claims = tokens.decode(body["token"])
    assert (claims.audience, claims.subject) == ("runner-group", str(body["id"]))
    read = owner_api.get(f"/api/v1/runner-groups/{body['id']}").json()
    assert "token" not in read
    assert read["labels"] == {"gpu": "a100"}
    assert all("token" not in g for g in owner_api.get("/api/v1/orgs/acme/runner-groups").json())


@pytest.mark.parametrize(
    "body",
    [
        {"name": "g", "labels": {"gantry:x": "y"}},
        {"name": "g", "labels": {"os": 1}},
        {"name": "g", "labels": ["os"]},
        {"name": "g", "max_concurrent_runs": 0},
        {"name": "g", "kind": "mainframe"},
        {"labels": {}},
    ],
)
def test_it_rejects_bad_group_input(owner_api: APIClient, body: dict[str, Any]) -> None:
    response = owner_api.post("/api/v1/orgs/acme/runner-groups", body, format="json")
    assert response.status_code == 400, response.json()
    assert RunnerGroup.objects.count() == 0


def test_it_refuses_a_duplicate_group_name(owner_api: APIClient, group: RunnerGroup) -> None:
    response = owner_api.post("/api/v1/orgs/acme/runner-groups", {"name": group.name}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "name_taken")


def test_it_rotates_drains_and_updates_a_group(owner_api: APIClient, group: RunnerGroup) -> None:
    rotated = owner_api.post(f"/api/v1/runner-groups/{group.id}/rotate-token")
    assert rotated.status_code == 200
    assert tokens.decode(rotated.json()["token"]).raw["ver"] == group.token_version + 1
    assert owner_api.post(f"/api/v1/runner-groups/{group.id}/drain").json()["drained"] is True
    assert owner_api.post(f"/api/v1/runner-groups/{group.id}/undrain").json()["drained"] is False
    patched = owner_api.patch(f"/api/v1/runner-groups/{group.id}", {"max_concurrent_runs": 2}, format="json")
    assert patched.json()["max_concurrent_runs"] == 2
    assert patched.json()["labels"] == {"os": "linux", "arch": "amd64"}


# ---------------------------------------------------------------- stacks and deployments


def test_it_creates_a_stack_and_never_shows_secret_values(owner_api: APIClient) -> None:
    body = {
        "name": "api",
        "labels": {"gantry:runner-group:os": "linux", "team": "core"},
        "spec": SPEC,
        "secrets": {"TOKEN": "s3cr3t"},
    }
    response = owner_api.post("/api/v1/orgs/acme/stacks", body, format="json")
    assert response.status_code == 201
    created = response.json()
    assert created["runner_selector"] == {"os": "linux"}
    assert created["secret_names"] == ["TOKEN"]
    assert "s3cr3t" not in response.content.decode()
    assert "s3cr3t" not in owner_api.get(f"/api/v1/stacks/{created['id']}").content.decode()


@pytest.mark.parametrize(
    "body",
    [
        {"name": "s", "labels": {"gantry:other": "x"}},
        {"name": "s", "labels": {"gantry:runner-group:": "x"}},
        {"name": "s", "spec": {"steps": []}},
        {"name": "s", "spec": {"steps": [{"name": "a"}]}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "x"}], "timout_seconds": 5}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "x"}], "timeout_seconds": 0}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "x"}], "env": {"A": 1}}},
        {"name": "s", "secrets": {"A": 1}},
        # issue 10: an empty spec is no spec; names a shell cannot use or must not set; what exec cannot take
        {"name": "s", "spec": {}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "x"}], "env": {"1BAD NAME": "x"}}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "x"}], "env": {"PATH": "/evil"}}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "x"}], "env": {"GANTRY_RUN_ID": "spoof"}}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "echo " + "x" * 130_000}]}},
        {"name": "s", "spec": {"steps": [{"name": "a", "run": "x"}], "env": {"BIG": "x" * 130_000}}},
        {"name": "s", "spec": {"steps": [{"name": f"s{i}", "run": "x" * 60_000} for i in range(20)]}},
    ],
)
def test_it_rejects_bad_stack_input(owner_api: APIClient, body: dict[str, Any]) -> None:
    response = owner_api.post("/api/v1/orgs/acme/stacks", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid_request"
    assert Stack.objects.count() == 0


def test_it_queues_deployments_on_the_stack_lane(teammate_api: APIClient, owner_api: APIClient, stack: Stack) -> None:
    first = teammate_api.post(f"/api/v1/stacks/{stack.id}/deployments", {}, format="json").json()
    second = owner_api.post(
        f"/api/v1/stacks/{stack.id}/deployments",
        {"spec": {"steps": [{"name": "other", "run": "true"}]}},
        format="json",
    ).json()
    assert (first["status"], first["run"]["status"]) == ("queued", "pending")
    assert (second["status"], second["run"]["status"]) == ("queued", "queued")
    assert second["spec"]["steps"][0]["name"] == "other"
    assert second["spec"]["timeout_seconds"] == 3600
    listed = teammate_api.get(f"/api/v1/stacks/{stack.id}/deployments").json()
    assert [d["id"] for d in listed] == [second["id"], first["id"]]


def test_it_rejects_a_bad_deployment_spec(owner_api: APIClient, stack: Stack) -> None:
    response = owner_api.post(f"/api/v1/stacks/{stack.id}/deployments", {"spec": {"steps": 3}}, format="json")
    assert response.status_code == 400
    assert Deployment.objects.count() == 0


def test_a_member_cannot_queue_a_spec_of_their_own(teammate_api: APIClient, stack: Stack) -> None:
    """The stack's secrets reach the steps: a member's own spec could print them (issue 10)."""
    body = {"spec": {"steps": [{"name": "x", "run": "echo $DEPLOY_KEY"}]}}
    response = teammate_api.post(f"/api/v1/stacks/{stack.id}/deployments", body, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "spec_override_forbidden"
    assert Deployment.objects.count() == 0
    # The stack's own spec is theirs to queue.
    assert teammate_api.post(f"/api/v1/stacks/{stack.id}/deployments", {}, format="json").status_code == 201


def test_it_needs_a_spec_when_the_stack_has_none(owner_api: APIClient) -> None:
    stack_id = owner_api.post("/api/v1/orgs/acme/stacks", {"name": "bare"}, format="json").json()["id"]
    response = owner_api.post(f"/api/v1/stacks/{stack_id}/deployments", {}, format="json")
    assert response.status_code == 400
    assert Run.objects.count() == 0


def test_it_skips_and_retries_deployments(teammate_api: APIClient, stack: Stack) -> None:
    first = teammate_api.post(f"/api/v1/stacks/{stack.id}/deployments", {}, format="json").json()
    second = teammate_api.post(f"/api/v1/stacks/{stack.id}/deployments", {}, format="json").json()
    skipped = teammate_api.post(f"/api/v1/deployments/{first['id']}/skip")
    assert skipped.status_code == 200
    assert (skipped.json()["status"], skipped.json()["run"]["status"]) == ("skipped", "discarded")
    # The lane moved on to the second deployment.
    assert Run.objects.get(id=second["run"]["id"]).status == "pending"
    again = teammate_api.post(f"/api/v1/deployments/{first['id']}/skip")
    assert (again.status_code, again.json()["code"]) == (409, "not_skippable")
    refused = teammate_api.post(f"/api/v1/deployments/{first['id']}/retry")
    assert (refused.status_code, refused.json()["code"]) == (409, "not_retryable")
    teammate_api.post(f"/api/v1/runs/{second['run']['id']}/cancel")
    retried = teammate_api.post(f"/api/v1/deployments/{second['id']}/retry").json()
    assert retried["status"] == "queued"
    assert retried["run"]["id"] != second["run"]["id"]
    assert Run.objects.get(id=retried["run"]["id"]).attempt == 2


def test_it_shows_a_run_with_its_events(teammate_api: APIClient, stack: Stack) -> None:
    deployment = services.deployment_create(stack=stack)
    run = deployment.runs.get()
    services.run_request_cancellation(run_id=run.id)
    body = teammate_api.get(f"/api/v1/runs/{run.id}").json()
    expected_keys = {
        "id",
        "status",
        "deployment_id",
        "stack_id",
        "runner_selector",
        "assigned_runner_id",
        "first_pending_at",
        "started_at",
        "finished_at",
        "exit_code",
        "failure_reason",
        "events",
    }
    assert expected_keys <= set(body)
    assert body["status"] == "cancelled"
    assert [e["kind"] for e in body["events"]] == ["created", "cancelled"]
    assert body["deployment_id"] == deployment.id


def test_it_refuses_to_cancel_a_finished_run(teammate_api: APIClient, stack: Stack) -> None:
    run = services.deployment_create(stack=stack).runs.get()
    teammate_api.post(f"/api/v1/runs/{run.id}/cancel")
    events = RunEvent.objects.filter(run=run).count()
    response = teammate_api.post(f"/api/v1/runs/{run.id}/cancel")
    assert (response.status_code, response.json()["code"]) == (409, "run_terminal")
    assert RunEvent.objects.filter(run=run).count() == events


def test_it_answers_json_404_for_unknown_api_paths(teammate_api: APIClient) -> None:
    for path in ("/api/v1/runs/not-a-uuid", "/api/v1/nope", "/api/v1/runs/00000000-0000-0000-0000-000000000000"):
        response = teammate_api.get(path)
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"


def test_it_rejects_malformed_json(teammate_api: APIClient, stack: Stack) -> None:
    response = teammate_api.post(
        f"/api/v1/stacks/{stack.id}/deployments", data="{not json", content_type="application/json"
    )
    assert (response.status_code, response.json()["code"]) == (400, "invalid_json")
