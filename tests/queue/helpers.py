"""Builders for the queue tests: real situations, made through the services and the runner protocol."""

from __future__ import annotations

import json
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


def bulk_backlog(
    org: Organization, *, stacks: int, queued_per_stack: int, selector: dict[str, str], prefix: str = "bulk"
) -> int:
    """``stacks`` stacks each holding one pending run and ``queued_per_stack`` queued behind it, in a few
    set-based statements (a read test and the benchmark need thousands; the services would take minutes).

    The rows are what the services would write: one lane holder per stack (the database's own index
    checks it), every run on the org's selector row, queued runs with no first_pending_at. Answers the
    number of waiting runs made.
    """
    from django.db import connection

    from gantry.core.models import SELECTOR_PREFIX
    from gantry.core.services import selector_id_for
    from tests.conftest import SPEC

    selector_id = selector_id_for(organization_id=org.id, selector=selector)
    labels = json.dumps({SELECTOR_PREFIX + k: v for k, v in selector.items()})
    per_stack = 1 + queued_per_stack
    with connection.cursor() as cur:
        cur.execute(
            """
            WITH s AS (
                INSERT INTO stack (organization_id, name, labels, spec, secrets, created_at)
                SELECT %(org)s, %(prefix)s || '-' || i, %(labels)s::jsonb, %(spec)s::jsonb, '{}'::jsonb, now()
                FROM generate_series(1, %(stacks)s) i
                RETURNING id
            ), d AS (
                INSERT INTO deployment (stack_id, status, spec, created_at, updated_at)
                SELECT s.id, 'queued', %(spec)s::jsonb, now(), now() FROM s, generate_series(1, %(per)s) j
                RETURNING id, stack_id
            ), numbered AS (
                SELECT id, stack_id, row_number() OVER (PARTITION BY stack_id ORDER BY id) AS n FROM d
            )
            INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector,
                             selector_id, first_pending_at, created_at, updated_at, exit_code, failure_reason,
                             sealed_chunks)
            SELECT gen_random_uuid(), %(org)s, stack_id, id, 1, CASE WHEN n = 1 THEN 'pending' ELSE 'queued' END,
                   %(selector)s::jsonb, %(selector_id)s, CASE WHEN n = 1 THEN now() END,
                   now() - make_interval(secs => %(total)s - row_number() OVER (ORDER BY stack_id, n)), now(),
                   NULL, '', 0
            FROM numbered
            """,
            {
                "org": org.id,
                "prefix": prefix,
                "labels": labels,
                "spec": json.dumps(SPEC),
                "stacks": stacks,
                "per": per_stack,
                "selector": json.dumps(selector),
                "selector_id": selector_id,
                "total": stacks * per_stack,
            },
        )
    return stacks * per_stack
