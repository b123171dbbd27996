"""Every way a run becomes claimable sends NOTIFY with its org (migration 0004's triggers)."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
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


def _idle_runners(group: RunnerGroup, n: int) -> list[Runner]:
    return [Runner.objects.create(runner_group=group, status="ready") for _ in range(n)]


def _count(group: RunnerGroup) -> int:
    return RunnerGroup.objects.values_list("runner_count", flat=True).get(id=group.id)


def test_a_deleted_runner_notifies_only_where_its_slot_can_start_a_run(
    claimable_listener: psycopg.Connection, acme: Organization
) -> None:
    # Migration 0015: a freed slot matters to polls parked on a full group, not to a group with room
    # (its polls park for want of runs, which a deletion does not change).
    roomy, _ = services.runner_group_create(org=acme, name="roomy", max_concurrent_runs=5)
    full, _ = services.runner_group_create(org=acme, name="full", max_concurrent_runs=2)
    spare = _idle_runners(roomy, 2)
    busy = _idle_runners(full, 2)
    drain_notifications(claimable_listener)

    Runner.objects.filter(id=spare[0].id).delete()
    assert drain_notifications(claimable_listener) == []
    assert _count(roomy) == 1
    Runner.objects.filter(id=busy[0].id).delete()  # the group was full: one slot is free now
    assert drain_notifications(claimable_listener) == [str(acme.id)]
    assert _count(full) == 1
    Runner.objects.filter(id=busy[1].id).delete()  # no longer full before this one
    assert drain_notifications(claimable_listener) == []


def test_a_github_actions_runner_always_notifies_the_dispatcher(
    claimable_listener: psycopg.Connection, acme: Organization
) -> None:
    from tests.github.conftest import gha_group

    gha = gha_group(acme)
    RunnerGroup.objects.filter(id=gha.id).update(max_concurrent_runs=100)
    runner = _idle_runners(gha, 1)[0]
    drain_notifications(claimable_listener)
    # Room in the group, but the dispatcher's per-org cap counts these rows: it must look again.
    Runner.objects.filter(id=runner.id).delete()
    assert drain_notifications(claimable_listener) == [str(acme.id)]


def test_one_statement_deleting_many_runners_writes_each_group_once_with_its_count(
    acme: Organization, globex: Organization
) -> None:
    a, _ = services.runner_group_create(org=acme, name="a", max_concurrent_runs=50)
    b, _ = services.runner_group_create(org=globex, name="b", max_concurrent_runs=50)
    _idle_runners(a, 7)
    _idle_runners(b, 4)
    assert (_count(a), _count(b)) == (7, 4)
    # One transaction: pg_stat_xact_user_tables counts within it.
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runner_group'")
        (before,) = cur.fetchone()
        # As a reaper's batch does: one DELETE for runners of several groups.
        cur.execute(
            "DELETE FROM runner WHERE id IN (SELECT id FROM runner WHERE runner_group_id = %s LIMIT 5) "
            "OR runner_group_id = %s",
            [a.id, b.id],
        )
        assert cur.rowcount == 9
        cur.execute("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runner_group'")
        (after,) = cur.fetchone()
    assert after - before == 2  # one write per group, not one per runner
    assert (_count(a), _count(b)) == (2, 0)
    for group in (a, b):
        assert _count(group) == Runner.objects.filter(runner_group=group).count()


def test_a_runner_moved_to_another_group_moves_its_slot(acme: Organization) -> None:
    a, _ = services.runner_group_create(org=acme, name="a")
    b, _ = services.runner_group_create(org=acme, name="b")
    runner = _idle_runners(a, 1)[0]
    Runner.objects.filter(id=runner.id).update(runner_group=b)
    assert (_count(a), _count(b)) == (0, 1)
