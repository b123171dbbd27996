"""A github_actions group's configuration: the four GitHub fields, checked at create and update, read back."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from gantry.core.models import Organization, RunnerGroup

pytestmark = pytest.mark.django_db

GROUPS = "/api/v1/orgs/acme/runner-groups"
GOOD = {
    "name": "actions",
    "kind": "github_actions",
    "github_owner": "acme-inc",
    "github_repo": "deploys",
    "github_workflow": "gantry-runner.yml",
    "github_ref": "main",
}


def test_it_creates_a_github_actions_group_and_reads_the_fields_back(acme: Organization, owner_api: APIClient) -> None:
    created = owner_api.post(GROUPS, GOOD, format="json")

    assert created.status_code == 201, created.content
    body = owner_api.get(f"/api/v1/runner-groups/{created.json()['id']}").json()
    assert {k: body[k] for k in GOOD} == GOOD
    assert "token" not in body


@pytest.mark.parametrize("field", ["github_owner", "github_repo", "github_workflow", "github_ref"])
def test_each_field_is_required(acme: Organization, owner_api: APIClient, field: str) -> None:
    response = owner_api.post(GROUPS, {k: v for k, v in GOOD.items() if k != field}, format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert field in response.json()["detail"]
    assert field in response.json()["fields"]
    assert not RunnerGroup.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("github_owner", "acme inc"),
        ("github_repo", ".."),
        ("github_workflow", "deploy.txt"),
        ("github_workflow", ".github/workflows/x.yml"),
        ("github_ref", "main branch"),
        ("github_ref", "feature..x"),
    ],
)
def test_malformed_values_are_refused_naming_the_field(
    acme: Organization, owner_api: APIClient, field: str, value: str
) -> None:
    response = owner_api.post(GROUPS, {**GOOD, field: value}, format="json")

    assert response.status_code == 400
    assert list(response.json()["fields"]) == [field]


def test_a_workflow_id_and_a_tag_ref_are_accepted(acme: Organization, owner_api: APIClient) -> None:
    body: dict[str, Any] = {**GOOD, "github_workflow": "161", "github_ref": "refs/tags/v1.2"}
    assert owner_api.post(GROUPS, body, format="json").status_code == 201


def test_a_self_hosted_group_takes_no_github_fields(acme: Organization, owner_api: APIClient) -> None:
    response = owner_api.post(GROUPS, {"name": "linux", "github_repo": "deploys"}, format="json")

    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["github_repo"]


def test_an_update_is_checked_against_the_whole_group(acme: Organization, owner_api: APIClient) -> None:
    group_id = owner_api.post(GROUPS, GOOD, format="json").json()["id"]

    blanked = owner_api.patch(f"/api/v1/runner-groups/{group_id}", {"github_ref": ""}, format="json")
    moved = owner_api.patch(f"/api/v1/runner-groups/{group_id}", {"github_ref": "release"}, format="json")

    assert blanked.status_code == 400
    assert list(blanked.json()["fields"]) == ["github_ref"]
    assert moved.status_code == 200
    assert moved.json()["github_ref"] == "release"
    assert RunnerGroup.objects.get(id=group_id).github_repo == "deploys"


def test_the_admin_form_names_the_field_too(acme: Organization, root: Any) -> None:
    from django.test import Client

    client = Client()
    client.force_login(root)
    response = client.post(
        "/admin/core/runnergroup/add/",
        {"organization": acme.id, "labels": "{}", "max_concurrent_runs": 10, **{**GOOD, "github_repo": ""}},
    )

    assert response.status_code == 200  # the form again, with the error
    assert "github_repo" in response.content.decode()
    assert "is required for a github_actions group" in response.content.decode()
    assert not RunnerGroup.objects.exists()
