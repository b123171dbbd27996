"""GET /orgs/{org}/runs, and a deployment's attempts (runs: [...])."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Organization, Run, RunnerGroup, Stack
from tests.core.drive import drive
from tests.dispatch.helpers import deploy, make_stack

pytestmark = pytest.mark.django_db

URL = "/api/v1/orgs/acme/runs"


def test_it_lists_the_orgs_runs_newest_first(
    teammate_api: APIClient, acme: Organization, stack: Stack, group: RunnerGroup, globex_stack: Stack
) -> None:
    older = deploy(stack)
    newer = deploy(make_stack(acme, "api"))
    deploy(globex_stack)  # another org's run never shows

    body = teammate_api.get(URL).json()

    assert [r["id"] for r in body["runs"]] == [str(newer.id), str(older.id)]
    assert body["runs"][1] == {**body["runs"][1], "stack_name": "web", "status": "pending", "attempt": 1}
    assert body["next_cursor"] is None


def test_it_filters_by_status_stack_and_deployment(teammate_api: APIClient, acme: Organization, stack: Stack) -> None:
    api = make_stack(acme, "api")
    a = deploy(stack)
    b = deploy(stack)  # queued behind a
    c = deploy(api)

    def ids(**params: object) -> list[str]:
        response = teammate_api.get(URL, params)
        assert response.status_code == 200
        return [r["id"] for r in response.json()["runs"]]

    assert ids(status="queued") == [str(b.id)]
    assert ids(stack_id=api.id) == [str(c.id)]
    assert ids(deployment_id=a.deployment_id) == [str(a.id)]
    assert ids(status="pending", stack_id=stack.id) == [str(a.id)]


def test_it_pages_newest_first(teammate_api: APIClient, acme: Organization) -> None:
    made = [deploy(make_stack(acme, f"s{i}")) for i in range(5)]
    seen, cursor = [], None
    while True:
        body = teammate_api.get(URL, {"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [r["id"] for r in body["runs"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [str(r.id) for r in reversed(made)]


@pytest.mark.parametrize(
    "params", [{"status": "sleeping"}, {"stack_id": "x"}, {"deployment_id": "-1"}, {"limit": "900"}]
)
def test_it_refuses_bad_filters(teammate_api: APIClient, acme: Organization, params: dict[str, str]) -> None:
    response = teammate_api.get(URL, params)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"


def test_it_hides_another_orgs_runs(outsider_api: APIClient, acme: Organization) -> None:
    assert outsider_api.get(URL).status_code == 404


def test_a_deployment_lists_every_attempt(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    failed = drive(stack, group, "failure").run
    services.deployment_retry(deployment_id=failed.deployment_id)
    retry = Run.objects.get(deployment_id=failed.deployment_id, attempt=2)

    body = teammate_api.get(f"/api/v1/deployments/{failed.deployment_id}").json()

    assert [(r["id"], r["attempt"], r["status"]) for r in body["runs"]] == [
        (str(failed.id), 1, "failure"),
        (str(retry.id), 2, "pending"),
    ]
    assert body["run"] == {"id": str(retry.id), "status": "pending", "priority": "normal"}
