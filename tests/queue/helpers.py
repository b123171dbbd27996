"""Builders for the queue tests: real situations, made through the services and the runner protocol."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from gantry.core.models import Organization, Run
from gantry.dispatch import throttle
from tests.throttle.helpers import group_api


def queue_of(client: APIClient, org: str = "acme", **params: Any) -> dict[str, Any]:
    response = client.get(f"/api/v1/orgs/{org}/queue", params)
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def reason_of(client: APIClient, run: Run, org: str = "acme") -> dict[str, Any]:
    """The reason the queue API gives for ``run`` (which must be waiting)."""
    for entry in queue_of(client, org, limit=500)["runs"]:
        if entry["id"] == str(run.id):
            reason: dict[str, Any] = entry["reason"]
            return reason
    raise AssertionError(f"run {run.id} is not in the queue")


def poll(group: Any) -> dict[str, Any] | None:
    """One real poll of the group (no wait): the claim's answer, or None for 204."""
    response = group_api(group).get("/api/v1/runner-groups/poll")
    assert response.status_code in (200, 204), response.content
    return response.json() if response.status_code == 200 else None


def spend_budget(org: Organization) -> None:
    """Empty the org's real token bucket in Redis (its whole burst)."""
    org.refresh_from_db()
    for _ in range(throttle.burst_for(org.runs_per_hour_limit)):
        assert throttle.take(organization_id=org.id, rate=org.runs_per_hour_limit).allowed
