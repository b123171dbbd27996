from rest_framework.test import APIClient

from gantry.core.models import Stack


def test_it_queues_a_deployment_end_to_end(owner_api: APIClient, stack: Stack) -> None:
    r = owner_api.post(f"/api/v1/stacks/{stack.id}/deployments", {}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["status"] == "queued"
    assert body["run"]["status"] == "pending"
    run = owner_api.get(f"/api/v1/runs/{body['run']['id']}").json()
    assert run["runner_selector"] == {"os": "linux"}
    assert [e["kind"] for e in run["events"]] == ["created"]
