"""Every way a run becomes claimable sends NOTIFY with its org (migration 0004's triggers)."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from gantry.core import services
from gantry.core.models import Organization, Runner, RunnerGroup, Stack
from gantry.dispatch.claim import claim

from ..conftest import drain_notifications

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_notifies_on_create_promote_lease_reset_and_release(
    claimable_listener: psycopg.Connection, acme: Organization, group: RunnerGroup, stack: Stack
) -> None:
    org = str(acme.id)
    first = services.deployment_create(stack=stack).runs.get()
    assert drain_notifications(claimable_listener) == [org]  # created pending
    services.deployment_create(stack=stack)
    assert drain_notifications(claimable_listener) == []  # created queued: nothing to claim
    claimed = claim(group=group)
    assert claimed is not None
    assert claimed.run_id == first.id
    assert drain_notifications(claimable_listener) == []  # assigned: nothing newly claimable
    later = timezone.now() + timedelta(minutes=6)
    services.run_reset_lease(run_id=first.id, now=later)
    # Pending again, but the pointer still names a live runner: not claimable yet.
    assert drain_notifications(claimable_listener) == []
    Runner.objects.filter(id=claimed.runner_id).delete()
    # The runner row went: the FK's SET NULL releases the run, and a slot frees up.
    assert drain_notifications(claimable_listener) == [org]
    services.run_request_cancellation(run_id=first.id)
    assert drain_notifications(claimable_listener) == [org]  # the queued run was promoted


def test_it_notifies_once_per_org_for_a_set_based_change(
    claimable_listener: psycopg.Connection, acme: Organization, group: RunnerGroup
) -> None:
    spec = {"steps": [{"name": "a", "run": "true"}]}
    stacks = [services.stack_create(org=acme, name=f"s{i}", labels={}, spec=spec) for i in range(5)]
    drain_notifications(claimable_listener)
    with connection.cursor() as cur:
        # Five runs made claimable by one statement (as a reaper would): one message.
        cur.execute(
            "INSERT INTO deployment (stack_id, status, spec, created_at, updated_at) "
            "SELECT id, 'queued', '{}'::jsonb, now(), now() FROM stack WHERE id = ANY(%s)",
            [[s.id for s in stacks]],
        )
        selector_id = services.selector_id_for(organization_id=acme.id, selector={})
        cur.execute(
            "INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector, "
            "selector_id, first_pending_at, failure_reason, sealed_chunks, created_at, updated_at) "
            "SELECT gen_random_uuid(), %s, d.stack_id, d.id, 1, 'pending', '{}'::jsonb, %s, now(), '', 0, now(), now() "
            "FROM deployment d WHERE d.stack_id = ANY(%s)",
            [acme.id, selector_id, [s.id for s in stacks]],
        )
        assert cur.rowcount == 5
    assert drain_notifications(claimable_listener) == [str(acme.id)]
