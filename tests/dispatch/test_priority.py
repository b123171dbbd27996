"""Priority in the claim (docs/queue.md, "Priority and aging"): higher first, then oldest, and nothing starves.

Every claim goes through ``gantry.dispatch.claim.claim`` with explicit times;
the aging window is the configured GANTRY_PRIORITY_AGING_SECONDS (900 unless
a test says otherwise), read the way the claim reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from gantry import conf
from gantry.core import services
from gantry.core.errors import RunNotWaiting
from gantry.core.models import Organization, Priority, Run, RunnerGroup, RunStatus, Stack
from gantry.dispatch.candidates import list_candidates
from gantry.dispatch.claim import claim
from tests.dispatch.helpers import at, make_group, make_stack, ttl

pytestmark = pytest.mark.django_db


def deploy(stack: Stack, priority: Priority | None, *, now: datetime) -> Run:
    deployment = services.deployment_create(stack=stack, priority=priority, now=now)
    return Run.objects.get(deployment=deployment)


def claimed(group: RunnerGroup, now: datetime) -> Run | None:
    won = claim(group=group, now=now)
    return Run.objects.get(id=won.run_id) if won is not None else None


def aging() -> int:
    return conf.get().priority_aging_seconds


@pytest.fixture
def big_group(acme: Organization) -> RunnerGroup:
    return make_group(acme, "big", {"os": "linux"}, max_concurrent_runs=50)


def test_three_stacks_queued_low_normal_high_are_claimed_high_normal_low(
    acme: Organization, big_group: RunnerGroup
) -> None:
    low = deploy(make_stack(acme, "a", {"os": "linux"}), Priority.LOW, now=at(0))
    normal = deploy(make_stack(acme, "b", {"os": "linux"}), Priority.NORMAL, now=at(1))
    high = deploy(make_stack(acme, "c", {"os": "linux"}), Priority.HIGH, now=at(2))

    order = [claimed(big_group, at(3 + i)) for i in range(3)]
    assert [r.id if r else None for r in order] == [high.id, normal.id, low.id]
    assert [r.priority if r else None for r in order] == [Priority.HIGH, Priority.NORMAL, Priority.LOW]
    assert claimed(big_group, at(10)) is None


def test_within_one_priority_the_oldest_goes_first(acme: Organization, big_group: RunnerGroup) -> None:
    runs = [deploy(make_stack(acme, f"s{i}", {"os": "linux"}), Priority.NORMAL, now=at(i)) for i in range(4)]
    got = [claimed(big_group, at(10 + i)) for i in range(4)]
    assert [r.id if r else None for r in got] == [r.id for r in runs]


def test_a_low_run_aged_past_high_is_claimed_before_a_fresh_high_one(
    acme: Organization, big_group: RunnerGroup
) -> None:
    # Two windows lift low to high; a tie at high goes to the longer waiting.
    old_low = deploy(make_stack(acme, "old", {"os": "linux"}), Priority.LOW, now=at(0))
    fresh_high = deploy(make_stack(acme, "fresh", {"os": "linux"}), Priority.HIGH, now=at(2 * aging() + 1))
    first = claimed(big_group, at(2 * aging() + 2))
    assert first is not None
    assert first.id == old_low.id
    second = claimed(big_group, at(2 * aging() + 3))
    assert second is not None
    assert second.id == fresh_high.id


def test_one_aging_window_lifts_low_to_normal_but_not_past_a_fresh_high(
    acme: Organization, big_group: RunnerGroup
) -> None:
    old_low = deploy(make_stack(acme, "old", {"os": "linux"}), Priority.LOW, now=at(0))
    young_normal = deploy(make_stack(acme, "mid", {"os": "linux"}), Priority.NORMAL, now=at(aging()))
    fresh_high = deploy(make_stack(acme, "fresh", {"os": "linux"}), Priority.HIGH, now=at(aging() + 1))
    now = aging() + 2  # old_low has waited one window: normal, and older than young_normal
    got = [claimed(big_group, at(now + i)) for i in range(3)]
    assert [r.id if r else None for r in got] == [fresh_high.id, old_low.id, young_normal.id]


def test_a_low_run_waits_about_two_windows_behind_a_steady_stream_of_high_ones(
    acme: Organization, big_group: RunnerGroup
) -> None:
    """One high run arrives per step and the group takes one run per step: the low run gets its turn once it
    has aged to high, about two windows after it queued, never later."""
    low = deploy(make_stack(acme, "low", {"os": "linux"}), Priority.LOW, now=at(0))
    step = aging() // 6
    taken_at = None
    for i in range(1, 20):
        now = i * step
        deploy(make_stack(acme, f"h{i}", {"os": "linux"}), Priority.HIGH, now=at(now))
        got = claimed(big_group, at(now + 1))
        assert got is not None
        if got.id == low.id:
            taken_at = now + 1
            break
    assert taken_at is not None, "the low run starved"
    assert 2 * aging() <= taken_at <= 2 * aging() + step + 1


def test_the_stack_default_priority_applies_when_a_deployment_names_none(
    acme: Organization, big_group: RunnerGroup
) -> None:
    urgent = make_stack(acme, "hotfix", {"os": "linux"})
    services.stack_update(stack=urgent, default_priority=Priority.HIGH)
    routine = deploy(make_stack(acme, "routine", {"os": "linux"}), None, now=at(0))
    hotfix = deploy(urgent, None, now=at(1))
    assert (routine.priority, hotfix.priority) == (Priority.NORMAL, Priority.HIGH)
    first = claimed(big_group, at(2))
    assert first is not None
    assert first.id == hotfix.id


def test_a_retry_keeps_its_runs_priority_even_when_an_admin_changed_it(acme: Organization, owner: object) -> None:
    stack = make_stack(acme, "web", {"os": "linux"})
    run = deploy(stack, Priority.LOW, now=at(0))
    services.run_set_priority(run_id=run.id, priority=Priority.HIGH, now=at(1))
    services.run_request_cancellation(run_id=run.id, now=at(2))
    services.deployment_retry(deployment_id=run.deployment_id, now=at(3))
    retry = Run.objects.get(deployment_id=run.deployment_id, attempt=2)
    assert retry.priority == Priority.HIGH
    events = list(Run.objects.get(id=run.id).events.filter(kind="priority_changed").values_list("detail", flat=True))
    assert events == [{"from": "low", "to": "high"}]


def test_changing_a_waiting_runs_priority_reorders_the_claim(acme: Organization, big_group: RunnerGroup) -> None:
    first_in = deploy(make_stack(acme, "a", {"os": "linux"}), Priority.NORMAL, now=at(0))
    second_in = deploy(make_stack(acme, "b", {"os": "linux"}), Priority.NORMAL, now=at(1))
    services.run_set_priority(run_id=second_in.id, priority=Priority.HIGH, now=at(2))
    got = claimed(big_group, at(3))
    assert got is not None
    assert got.id == second_in.id
    assert Run.objects.get(id=first_in.id).status == RunStatus.PENDING


def test_a_claimed_run_keeps_its_priority(acme: Organization, big_group: RunnerGroup) -> None:
    run = deploy(make_stack(acme, "a", {"os": "linux"}), Priority.LOW, now=at(0))
    assert claimed(big_group, at(1)) is not None
    with pytest.raises(RunNotWaiting):
        services.run_set_priority(run_id=run.id, priority=Priority.HIGH, now=at(2))
    assert Run.objects.get(id=run.id).priority == Priority.LOW
    assert not Run.objects.get(id=run.id).events.filter(kind="priority_changed").exists()


def test_a_queued_runs_priority_may_change_and_holds_once_it_is_promoted(acme: Organization) -> None:
    stack = make_stack(acme, "web", {"os": "linux"})
    holder = deploy(stack, Priority.NORMAL, now=at(0))
    queued = deploy(stack, Priority.NORMAL, now=at(1))
    assert queued.status == RunStatus.QUEUED
    services.run_set_priority(run_id=queued.id, priority=Priority.LOW, now=at(2))
    services.run_request_cancellation(run_id=holder.id, now=at(3))
    queued.refresh_from_db()
    assert (queued.status, queued.priority) == (RunStatus.PENDING, Priority.LOW)


def test_priority_orders_runs_across_the_selectors_a_group_serves(acme: Organization) -> None:
    wide = make_group(acme, "wide", {"os": "linux", "gpu": "yes"}, max_concurrent_runs=10)
    plain = deploy(make_stack(acme, "plain", {"os": "linux"}), Priority.NORMAL, now=at(0))
    gpu = deploy(make_stack(acme, "gpu", {"gpu": "yes"}), Priority.HIGH, now=at(5))
    got = [claimed(wide, at(10 + i)) for i in range(2)]
    assert [r.id if r else None for r in got] == [gpu.id, plain.id]


@pytest.fixture
def short_aging(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setenv("GANTRY_PRIORITY_AGING_SECONDS", "60")
    conf.get.cache_clear()
    yield 60
    monkeypatch.undo()
    conf.get.cache_clear()


def test_the_aging_window_is_the_configured_one(acme: Organization, big_group: RunnerGroup, short_aging: int) -> None:
    old_low = deploy(make_stack(acme, "old", {"os": "linux"}), Priority.LOW, now=at(0))
    deploy(make_stack(acme, "fresh", {"os": "linux"}), Priority.HIGH, now=at(2 * short_aging))
    first = claimed(big_group, at(2 * short_aging + 1))
    assert first is not None
    assert first.id == old_low.id


def test_the_backend_dispatchers_candidates_follow_the_claims_order(acme: Organization) -> None:
    make_group(
        acme,
        "gha",
        {"os": "linux"},
        kind="github_actions",
        max_concurrent_runs=10,
        github_owner="acme",
        github_repo="infra",
        github_workflow="runner.yml",
        github_ref="main",
    )
    low = deploy(make_stack(acme, "a", {"os": "linux"}), Priority.LOW, now=at(0))
    normal = deploy(make_stack(acme, "b", {"os": "linux"}), Priority.NORMAL, now=at(1))
    high = deploy(make_stack(acme, "c", {"os": "linux"}), Priority.HIGH, now=at(2))
    aged_low = deploy(make_stack(acme, "d", {"os": "linux"}), Priority.LOW, now=at(-2 * aging()))
    found = [c.run_id for c in list_candidates(now=at(3), limit=10)]
    assert found == [aged_low.id, high.id, normal.id, low.id]


def test_a_lapsed_lease_keeps_its_runs_priority_and_place(acme: Organization, big_group: RunnerGroup) -> None:
    high = deploy(make_stack(acme, "h", {"os": "linux"}), Priority.HIGH, now=at(0))
    won = claim(group=big_group, now=at(1))
    assert won is not None
    normal = deploy(make_stack(acme, "n", {"os": "linux"}), Priority.NORMAL, now=at(2))
    lapsed = at(1) + ttl() + ttl()
    services.run_reset_lease(run_id=high.id, now=lapsed)
    services.runner_deregister(runner_id=won.runner_id, now=lapsed)
    again = claimed(big_group, lapsed)
    assert again is not None
    assert again.id == high.id
    assert Run.objects.get(id=normal.id).status == RunStatus.PENDING
