"""GET /api/v1/runner-groups/{id}/runners: a group's runners, with the run each is bound to."""

from __future__ import annotations

from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import RunnerGroup, Stack

from .helpers import T0, accepted, at, claim_at, deploy


def test_it_lists_the_groups_runners_with_their_runs(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    run, busy = accepted(stack, group, T0, hostname="node-1", launcher="local", pid=42)
    other = services.stack_create(org=stack.organization, name="other", labels=stack.labels, spec=stack.spec)
    done = deploy(other, now=at(1))
    finished = claim_at(group, at(1))
    services.run_accept(run_id=done.id, runner_id=finished.runner_id, now=at(2))
    services.run_finish(run_id=done.id, outcome="succeeded", exit_code=0, now=at(3))

    response = teammate_api.get(f"/api/v1/runner-groups/{group.id}/runners")

    assert response.status_code == 200
    rows = response.json()
    assert [r["id"] for r in rows] == [str(busy), str(finished.runner_id)]  # oldest first
    assert set(rows[0]) == {"id", "status", "created_at", "ready_at", "accepted_at", "last_seen_at", "hostname",
                            "launcher", "pid", "run_id", "workflow_run_id", "workflow_run_url",
                            "dispatched_at"}  # fmt: skip
    assert (rows[0]["status"], rows[0]["hostname"], rows[0]["pid"]) == ("busy", "node-1", 42)
    assert rows[0]["run_id"] == str(run.id)
    # A finished run keeps its runner pointer, but the runner no longer holds it.
    assert rows[1]["run_id"] is None


def test_it_hides_another_orgs_group(outsider_api: APIClient, anon: APIClient, group: RunnerGroup) -> None:
    assert outsider_api.get(f"/api/v1/runner-groups/{group.id}/runners").status_code == 404
    assert anon.get(f"/api/v1/runner-groups/{group.id}/runners").status_code == 401
