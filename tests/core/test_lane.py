"""PromoteNextOnStack: whenever the lane holder ends, the oldest queued run of its stack becomes pending."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from gantry.core import services
from gantry.core.errors import Conflict
from gantry.core.models import DeploymentStatus, Run, RunnerGroup, RunStatus, Stack
from tests.core.drive import (
    Driven,
    advance,
    at,
    deploy,
    deployment_status,
    drive,
    event_kinds,
    lease,
    new_runner,
    reload,
)


def _queue(stack: Stack, *seconds: int) -> list[Run]:
    return [deploy(stack, now=at(s)) for s in seconds]


def _statuses(runs: list[Run]) -> list[str]:
    return [reload(r).status for r in runs]


# Every way the holder can end, each taken from the state where it applies.
# (state the holder is driven to, steps that end it)
ENDINGS: dict[str, tuple[str, list[str]]] = {
    "finished succeeded": ("running", ["finish_succeeded"]),
    "finished failure": ("running", ["finish_failure"]),
    "cancelled after start": ("cancelling", ["finish_cancelled"]),
    "cancelled while pending": ("pending", ["request_cancel"]),
    "cancelled while assigned": ("assigned", ["request_cancel"]),
    "skipped while pending": ("pending", ["skip"]),
    "skipped while assigned": ("assigned", ["skip"]),
    "failed while running": ("running", ["fail"]),
    "failed while assigned": ("assigned", ["fail"]),
    "startup timeout": ("pending", ["startup_timeout"]),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_it_promotes_the_oldest_queued_run_whichever_way_the_holder_ends(
    stack: Stack, group: RunnerGroup, ending: str
) -> None:
    state, steps = ENDINGS[ending]
    holder = drive(stack, group, state, now=at(0))
    queued = _queue(stack, 100, 101, 102)
    assert _statuses(queued) == ["queued"] * 3

    holder.now = at(200)
    advance(holder, group, steps)

    assert holder.run.status in {"succeeded", "failure", "cancelled", "discarded", "startup_timeout"}
    assert _statuses(queued) == ["pending", "queued", "queued"]
    promoted = reload(queued[0])
    # Stamped when it became pending (the moment the holder ended), not when it was created.
    assert promoted.first_pending_at == at(201)
    assert deployment_status(promoted) == DeploymentStatus.QUEUED
    assert event_kinds(promoted) == ["created", "promoted"]
    for run in queued[1:]:
        assert reload(run).first_pending_at is None


def test_it_promotes_in_order_down_the_whole_queue(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))
    queued = _queue(stack, 10, 11, 12, 13)
    ends: list[Callable[[Driven, datetime], None]] = [
        lambda d, t: services.run_finish(run_id=d.run.id, outcome="succeeded", exit_code=0, now=t),
        lambda d, t: services.run_request_cancellation(run_id=d.run.id, now=t),
        lambda d, t: services.deployment_skip(deployment_id=d.run.deployment_id, now=t),
        lambda d, t: services.run_fail(run_id=d.run.id, reason="lost", now=t),
    ]

    current = holder
    for i, end in enumerate(ends):
        end(current, at(100 + i))
        assert _statuses(queued[: i + 1])[-1] == "pending"
        assert _statuses(queued[i + 1 :]) == ["queued"] * (len(queued) - i - 1)
        current = Driven(run=reload(queued[i]))

    # The last promoted run now holds the lane alone.
    assert [r.status for r in Run.objects.filter(stack=stack, status__in=["pending", "queued"])] == ["pending"]
    assert reload(queued[-1]).first_pending_at == at(103)


def test_it_orders_the_queue_by_creation_time_not_by_id(stack: Stack, group: RunnerGroup) -> None:
    # Run ids are random uuids; the tie-breaker must never decide while creation times differ.
    holder = drive(stack, group, "running", now=at(0))
    queued = _queue(stack, *range(10, 20))

    t = 100
    current = holder.run
    for run in queued:
        services.run_fail(run_id=current.id, reason="next", now=at(t))
        assert reload(run).status == RunStatus.PENDING
        current = run
        t += 1


def test_it_does_not_promote_when_a_queued_run_ends(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))
    first, second, third = _queue(stack, 10, 11, 12)

    services.deployment_skip(deployment_id=second.deployment_id, now=at(20))
    services.run_request_cancellation(run_id=third.id, now=at(21))

    assert reload(holder.run).status == RunStatus.RUNNING
    assert _statuses([first, second, third]) == ["queued", "discarded", "cancelled"]
    assert deployment_status(second) == DeploymentStatus.SKIPPED
    assert deployment_status(third) == DeploymentStatus.CANCELLED
    # Ending the holder promotes the one still queued.
    services.run_finish(run_id=holder.run.id, outcome="succeeded", exit_code=0, now=at(30))
    assert reload(first).status == RunStatus.PENDING


def test_it_leaves_the_lane_free_when_nothing_is_queued(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))

    services.run_finish(run_id=holder.run.id, outcome="succeeded", exit_code=0, now=at(10))

    assert not Run.objects.filter(stack=stack).exclude(id=holder.run.id).exists()
    assert deploy(stack, now=at(20)).status == RunStatus.PENDING


def test_it_stamps_first_pending_at_once_across_a_lease_reset_cycle(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))
    run = deploy(stack, now=at(5))
    services.run_finish(run_id=holder.run.id, outcome="succeeded", exit_code=0, now=at(10))
    assert reload(run).first_pending_at == at(10)

    runner = new_runner(group)
    services.run_assign(run_id=run.id, runner=runner, now=at(20))
    reset_at = at(20) + lease() + timedelta(seconds=1)
    services.run_reset_lease(run_id=run.id, now=reset_at)

    run = reload(run)
    assert run.status == RunStatus.PENDING
    assert run.first_pending_at == at(10)
    assert run.assigned_runner_id == runner.id
    assert run.assigned_at is None
    assert run.assigned_expires_at is None

    # A second cycle, by another runner (once the first is gone), still keeps the original stamp.
    services.runner_deregister(runner_id=runner.id, now=reset_at)
    other = new_runner(group)
    services.run_assign(run_id=run.id, runner=other, now=reset_at)
    services.run_reset_lease(run_id=run.id, now=reset_at + lease() + lease())
    run = reload(run)
    assert run.first_pending_at == at(10)
    assert run.assigned_runner_id == other.id
    assert event_kinds(run) == ["created", "promoted", "assigned", "lease_expired", "assigned", "lease_expired"]


def test_it_does_not_reset_a_lease_that_has_not_lapsed(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned", now=at(0))
    expires = d.run.assigned_expires_at
    assert expires == at(1) + lease()

    for now in (at(2), expires):
        with pytest.raises(Conflict):
            services.run_reset_lease(run_id=d.run.id, now=now)

    run = reload(d.run)
    assert run.status == RunStatus.ASSIGNED
    assert run.assigned_expires_at == expires
    assert event_kinds(run) == ["created", "assigned"]
