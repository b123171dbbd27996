"""GET /orgs/{org}/queue: scoping, order, paging, bad parameters, and a read whose statements do not grow."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from gantry.core.models import Organization, Run, RunnerGroup, Stack
from tests.dispatch.helpers import deploy, make_stack
from tests.queue.helpers import bulk_backlog, poll, queue_of
from tests.throttle.helpers import group_api

pytestmark = pytest.mark.django_db

URL = "/api/v1/orgs/acme/queue"


def test_it_lists_waiting_runs_oldest_first_with_their_fields(
    teammate_api: APIClient, acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    first = deploy(stack)
    second = deploy(stack)
    other = deploy(make_stack(acme, "api", {"os": "linux"}))
    poll(group)  # claims the oldest: first is now assigned

    runs = queue_of(teammate_api)["runs"]

    assert [r["id"] for r in runs] == [str(first.id), str(second.id), str(other.id)]
    assert [r["status"] for r in runs] == ["assigned", "queued", "pending"]
    assert runs[1] == {
        **runs[1],
        "stack_id": stack.id,
        "stack_name": "web",
        "deployment_id": second.deployment_id,
    }
    assert all(isinstance(r["waiting_seconds"], int) and r["waiting_seconds"] >= 0 for r in runs)
    assert {r["reason"]["code"] for r in runs} == {"runner_booting", "waiting_for_lane", "dispatchable"}


def test_it_leaves_out_running_and_finished_runs(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack)
    claim = poll(group)
    assert claim is not None
    from gantry.core import services

    services.run_accept(run_id=run.id, runner_id=claim["runner_id"])
    assert queue_of(teammate_api)["runs"] == []


def test_it_pages_with_a_cursor(teammate_api: APIClient, acme: Organization) -> None:
    made = [deploy(make_stack(acme, f"s{i}", {"os": "linux"})) for i in range(5)]

    first = queue_of(teammate_api, limit=2)
    second = queue_of(teammate_api, limit=2, cursor=first["next_cursor"])
    third = queue_of(teammate_api, limit=2, cursor=second["next_cursor"])

    seen = [r["id"] for page in (first, second, third) for r in page["runs"]]
    assert seen == [str(r.id) for r in made]
    assert third["next_cursor"] is None


@pytest.mark.parametrize(
    "params", [{"limit": "0"}, {"limit": "501"}, {"limit": "ten"}, {"cursor": "nonsense"}, {"cursor": "e30"}]
)
def test_it_refuses_bad_paging(teammate_api: APIClient, acme: Organization, params: dict[str, str]) -> None:
    response = teammate_api.get(URL, params)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"


def test_it_is_scoped_to_members(
    outsider_api: APIClient, anon: APIClient, root_api: APIClient, acme: Organization, group: RunnerGroup
) -> None:
    assert outsider_api.get(URL).status_code == 404
    assert outsider_api.get("/api/v1/orgs/nope/queue").status_code == 404
    assert anon.get(URL).status_code == 401
    assert group_api(group).get(URL).status_code == 403
    assert root_api.get(URL).status_code == 200


@pytest.mark.parametrize("waiting", [10, 10_000])
def test_the_read_is_a_fixed_handful_of_statements(
    teammate_api: APIClient, acme: Organization, group: RunnerGroup, waiting: int
) -> None:
    """The same statements for 10 waiting runs as for 10,000 (a page of 500 of them)."""
    made = bulk_backlog(acme, stacks=waiting // 10, queued_per_stack=9, selector={"os": "linux"})
    assert Run.objects.filter(organization=acme).count() == made == waiting

    with CaptureQueriesContext(connection) as queries:
        body = queue_of(teammate_api, limit=500)

    assert len(body["runs"]) == min(500, waiting)
    # token auth, the org, the caller's role, the page, the groups, the page's positions: six, whatever the backlog.
    assert len(queries) == 6, [q["sql"][:80] for q in queries]
    codes = {r["reason"]["code"] for r in body["runs"]}
    assert codes == {"waiting_for_lane", "no_runner_polling"}
