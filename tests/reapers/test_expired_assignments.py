"""Reset expired assignments: assigned past the lease → pending, lease cleared, runner pointer kept."""

from __future__ import annotations

from gantry.core import services
from gantry.core.models import RunnerGroup, RunStatus, Stack
from gantry.dispatch.claim import claim
from gantry.reapers.reapers import reset_expired_assignments
from tests.conftest import SPEC

from .helpers import T0, after, at, claim_at, deploy, event_kinds, reload, world


def test_it_returns_a_run_past_its_lease_to_pending_and_keeps_its_runner(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    c = claim_at(group, T0)

    assert reset_expired_assignments(now=after(T0, "assignment_ttl", -1)).counts["reset"] == 0
    assert reload(run).status == RunStatus.ASSIGNED

    result = reset_expired_assignments(now=after(T0, "assignment_ttl", 1))

    assert result.counts["reset"] == 1
    row = reload(run)
    assert (row.status, row.assigned_at, row.assigned_expires_at) == (RunStatus.PENDING, None, None)
    # One Runner Per Run: the pointer stays while the stub lives, so no second runner is sent.
    assert row.assigned_runner_id == c.runner_id
    assert claim(group=group, now=after(T0, "assignment_ttl", 2)) is None
    assert row.first_pending_at == T0
    assert event_kinds(run) == ["created", "assigned", "lease_expired"]


def test_it_leaves_runs_in_other_states_alone(stack: Stack, group: RunnerGroup) -> None:
    running = deploy(stack, now=T0)
    c = claim_at(group, T0)
    assert c.run_id == running.id
    other = services.stack_create(org=stack.organization, name="other", spec=SPEC)
    pending = deploy(other, now=at(1))  # claimable, but nobody polled
    # A running run keeps its (long past) lease columns: only status 'assigned' is swept.
    services.run_accept(run_id=running.id, runner_id=c.runner_id, now=at(1))
    before = world()

    result = reset_expired_assignments(now=at(minutes=60))

    assert result.counts["reset"] == 0
    assert world() == before
    assert reload(pending).status == RunStatus.PENDING


def test_it_is_idempotent(stack: Stack, group: RunnerGroup) -> None:
    deploy(stack, now=T0)
    claim_at(group, T0)
    later = after(T0, "assignment_ttl", 1)
    assert reset_expired_assignments(now=later).counts["reset"] == 1
    before = world()

    again = reset_expired_assignments(now=later)

    assert again.acted == 0
    assert world() == before


def test_it_works_in_bounded_batches_oldest_lease_first(group: RunnerGroup) -> None:
    runs = []
    for i in range(5):
        labels = {"gantry:runner-group:os": "linux"}
        stack = services.stack_create(org=group.organization, name=f"s{i}", labels=labels, spec=SPEC)
        runs.append(deploy(stack, now=at(i)))
        claim_at(group, at(i))  # leases lapse one second apart, oldest first
    later = at(minutes=60)

    first = reset_expired_assignments(now=later, batch_size=2, max_rows=3)

    assert first.counts["reset"] == 3
    assert [reload(r).status for r in runs] == ["pending"] * 3 + ["assigned"] * 2
    assert reset_expired_assignments(now=later, batch_size=2, max_rows=3).counts["reset"] == 2
    assert {reload(r).status for r in runs} == {"pending"}
