"""Every way a run becomes claimable sends NOTIFY with its org (migration 0004's triggers)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from gantry.core import services
from gantry.core.models import Organization, Runner, RunnerGroup, Stack
from gantry.dispatch.claim import claim

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listen() -> Iterator[psycopg.Connection]:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("LISTEN gantry_claimable")
        yield conn


def _drain(conn: psycopg.Connection) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5)]


def test_it_notifies_on_create_promote_lease_reset_and_release(
    listen: psycopg.Connection, acme: Organization, group: RunnerGroup, stack: Stack
) -> None:
    org = str(acme.id)
    first = services.deployment_create(stack=stack).runs.get()
    assert _drain(listen) == [org]  # created pending
    services.deployment_create(stack=stack)
    assert _drain(listen) == []  # created queued: nothing to claim
    claimed = claim(group=group)
    assert claimed is not None
    assert claimed.run_id == first.id
    assert _drain(listen) == []  # assigned: nothing newly claimable
    later = timezone.now() + timedelta(minutes=6)
    services.run_reset_lease(run_id=first.id, now=later)
    # Pending again, but the pointer still names a live runner: not claimable yet.
    assert _drain(listen) == []
    Runner.objects.filter(id=claimed.runner_id).delete()
    # The runner row went: the FK's SET NULL releases the run, and a slot frees up.
    assert _drain(listen) == [org]
    services.run_request_cancellation(run_id=first.id)
    assert _drain(listen) == [org]  # the queued run was promoted


def test_it_notifies_once_per_org_for_a_set_based_change(
    listen: psycopg.Connection, acme: Organization, group: RunnerGroup
) -> None:
    spec = {"steps": [{"name": "a", "run": "true"}]}
    stacks = [services.stack_create(org=acme, name=f"s{i}", labels={}, spec=spec) for i in range(5)]
    _drain(listen)
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
    assert _drain(listen) == [str(acme.id)]
