"""A waiting run's place in line and its expected start (docs/queue.md): the queue read against the claim itself.

Every claim goes through ``gantry.dispatch.claim.claim`` with explicit times
(``at(seconds)``), so the claim's aging and its recorded hand-outs follow the
test's clock; positions are read through ``queue.read_queue`` at the same times.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from gantry import conf, metrics
from gantry import redis as gantry_redis
from gantry.core import services
from gantry.core.models import Organization, Priority, Run, RunnerGroup, RunStatus, Stack
from gantry.dispatch import queue
from gantry.dispatch.claim import claim
from tests.dispatch.helpers import at, make_group, make_stack
from tests.queue.helpers import bulk_backlog, queue_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_buckets", "no_handouts")]


@pytest.fixture
def no_handouts() -> Iterator[None]:
    """No hand-out counted before the test (an earlier run of the suite may have left some for these group ids)."""
    metrics.flush_runs()
    client = gantry_redis.client()
    for key in client.scan_iter("gantry:handouts:*"):
        client.delete(key)
    yield
    metrics.flush_runs()


@pytest.fixture
def unthrottled(acme: Organization) -> Organization:
    # These tests claim dozens of runs; the budget is not what they are about.
    services.org_set_runs_per_hour_limit(org=acme, limit=1_000_000)
    acme.refresh_from_db()
    return acme


def deploy(stack: Stack, priority: Priority, now: datetime) -> Run:
    deployment = services.deployment_create(stack=stack, priority=priority, now=now)
    return Run.objects.get(deployment=deployment)


def entries(org: Organization, now: datetime) -> dict[str, queue.QueueEntry]:
    """The queue's entries by run id (one page holds them all)."""
    page = queue.read_queue(org=org, now=now, limit=queue.PAGE_MAX)
    return {str(e.run.id): e for e in page.entries}


def line_of(group: RunnerGroup, found: dict[str, queue.QueueEntry]) -> list[str]:
    """The runs standing best in ``group``, by position; asserts the positions are exactly 1..n."""
    mine = sorted((e for e in found.values() if e.position_group_id == group.id), key=lambda e: e.position or 0)
    assert [e.position for e in mine] == list(range(1, len(mine) + 1))
    return [str(e.run.id) for e in mine]


def release(run_id: uuid.UUID, runner_id: uuid.UUID, now: datetime) -> None:
    """The claimed run goes away before it starts (cancelled: its lane moves on) and its runner leaves (the slot
    frees)."""
    services.run_request_cancellation(run_id=run_id, now=now)
    services.runner_deregister(runner_id=runner_id, now=now)


# ---------------------------------------------------------------- positions are the claim's order


def test_positions_match_the_claim_order_at_every_step_while_a_group_drains_the_queue(
    unthrottled: Organization,
) -> None:
    org = unthrottled
    aging = conf.get().priority_aging_seconds
    # arm serves both linux selectors; mac's runs stand in mac's line and never in arm's.
    arm = make_group(org, "arm", {"os": "linux", "arch": "arm"}, max_concurrent_runs=50)
    mac = make_group(org, "mac", {"os": "macos"})
    linux = [make_stack(org, f"linux{i}", {"os": "linux"}) for i in range(4)]
    arms = [make_stack(org, f"arm{i}", {"os": "linux", "arch": "arm"}) for i in range(3)]
    macos = make_stack(org, "macos", {"os": "macos"})
    L, N, H = Priority.LOW, Priority.NORMAL, Priority.HIGH
    old_low = deploy(linux[0], L, at(0))
    behind_old_low = deploy(linux[0], H, at(1))  # queued behind its lane
    plan = [(linux[1], N, 2), (linux[2], H, 3), (linux[3], L, 4), (arms[0], N, 5), (arms[1], H, 6), (arms[2], L, 7)]
    made = {stack.name: deploy(stack, p, at(t)) for stack, p, t in plan}
    behind_arm0 = deploy(arms[0], L, at(8))  # queued: promoted when arms[0]'s run goes
    deploy(linux[2], N, at(9))  # queued behind linux2's high run
    mac_run = deploy(macos, H, at(10))

    now = 20.0
    found = entries(org, at(now))
    first_line = line_of(arm, found)
    # high, then normal, then low; oldest first within each; the queued ones have no place.
    assert first_line == [str(made[s].id) for s in ("linux2", "arm1", "linux1", "arm0")] + [
        str(old_low.id),
        str(made["linux3"].id),
        str(made["arm2"].id),
    ]
    assert line_of(mac, found) == [str(mac_run.id)]
    assert found[str(behind_old_low.id)].position is None
    assert found[str(behind_arm0.id)].position is None

    claimed: list[str] = []
    aged = promoted = False
    while True:
        found = entries(org, at(now))
        line = line_of(arm, found)
        won = claim(group=arm, now=at(now))
        if not line:
            assert won is None
            break
        assert won is not None
        # The claim takes the run at position 1, whatever else changed since the last step.
        assert str(won.run_id) == line[0], (now, line)
        claimed.append(line[0])
        after = entries(org, at(now))
        if after.get(line[0]) is not None:
            # Claimed: assigned now, out of line; everyone behind moved up one.
            assert after[line[0]].position is None
        assert line_of(arm, after) == line[1:]
        if line[0] == str(made["arm0"].id) and not promoted:
            # Its stack's next run becomes pending once it goes: it joins the line, in its place.
            release(won.run_id, won.runner_id, at(now + 1))
            now += 2
            joined = entries(org, at(now))
            assert joined[str(behind_arm0.id)].run.status == RunStatus.PENDING
            assert str(behind_arm0.id) in line_of(arm, joined)
            promoted = True
        elif len(claimed) == 3 and not aged:
            # Jump two aging windows: old_low (pending since 0) has aged to high and overtakes the rest,
            # the runs still waiting having aged too but from lower levels or younger.
            before = line_of(arm, entries(org, at(now)))
            now = 2 * aging + 1
            reordered = entries(org, at(now))
            line_now = line_of(arm, reordered)
            assert line_now[0] == str(old_low.id) != before[0]
            assert reordered[str(old_low.id)].effective_priority == Priority.HIGH
            aged = True
        now += 5
    assert aged
    assert promoted
    assert str(old_low.id) in claimed
    assert str(behind_arm0.id) in claimed
    # mac's run was never arm's to take.
    assert str(mac_run.id) not in claimed


# ---------------------------------------------------------------- behind higher priority


def test_a_run_behind_higher_priority_ones_says_so_with_how_many(
    teammate_api: APIClient, unthrottled: Organization
) -> None:
    org = unthrottled
    small = make_group(org, "small", {"os": "linux"}, max_concurrent_runs=2)
    deploy(make_stack(org, "busy", {"os": "linux"}), Priority.NORMAL, at(0))
    assert claim(group=small, now=at(1)) is not None  # one of two slots taken
    waiting = deploy(make_stack(org, "routine", {"os": "linux"}), Priority.NORMAL, at(2))
    urgent = [deploy(make_stack(org, f"hotfix{i}", {"os": "linux"}), Priority.HIGH, at(3 + i)) for i in range(2)]

    found = entries(org, at(10))

    entry = found[str(waiting.id)]
    assert (entry.position, entry.position_group_id) == (3, small.id)
    assert entry.reason["code"] == "behind_higher_priority"
    assert (entry.reason["group_id"], entry.reason["ahead_higher"]) == (small.id, 2)
    assert entry.reason["detail"] == "2 runs of higher priority are ahead of it for small (1 of 2 slots taken)."
    # The high ones: the first is within the free slot; none has a higher one ahead.
    assert [found[str(r.id)].position for r in urgent] == [1, 2]
    assert "behind_higher_priority" not in {found[str(r.id)].reason["code"] for r in urgent}
    # The API says the same, names included.
    api = {r["id"]: r for r in queue_of(teammate_api, limit=500)["runs"]}[str(waiting.id)]
    assert api["reason"] == {**api["reason"], "code": "behind_higher_priority", "ahead_higher": 2}
    assert (api["position"], api["position_group"]) == (3, {"id": small.id, "name": "small"})
    assert (api["priority"], api["effective_priority"]) == ("normal", "normal")
    # And the claim agrees: the next two polls take the high ones.
    taken = [claim(group=small, now=at(11))]
    release(taken[0].run_id, taken[0].runner_id, at(12))  # type: ignore[union-attr]
    taken.append(claim(group=small, now=at(13)))
    assert [str(c.run_id) for c in taken if c] == [str(r.id) for r in urgent]


def test_a_run_with_only_same_priority_runs_ahead_is_not_behind_higher_priority(unthrottled: Organization) -> None:
    org = unthrottled
    small = make_group(org, "small", {"os": "linux"}, max_concurrent_runs=1)
    deploy(make_stack(org, "busy", {"os": "linux"}), Priority.HIGH, at(0))
    assert claim(group=small, now=at(1)) is not None
    ahead = deploy(make_stack(org, "a", {"os": "linux"}), Priority.NORMAL, at(2))
    behind = deploy(make_stack(org, "b", {"os": "linux"}), Priority.NORMAL, at(3))

    found = entries(org, at(10))

    assert [found[str(r.id)].position for r in (ahead, behind)] == [1, 2]
    assert found[str(behind.id)].reason["code"] == "groups_at_capacity"


# ---------------------------------------------------------------- no position


def test_runs_that_cannot_be_claimed_now_have_no_position(unthrottled: Organization) -> None:
    org = unthrottled
    group = make_group(org, "linux", {"os": "linux"}, max_concurrent_runs=10)
    stack = make_stack(org, "web", {"os": "linux"})
    assigned = deploy(stack, Priority.NORMAL, at(0))
    queued = deploy(stack, Priority.HIGH, at(1))
    held_stack = make_stack(org, "held", {"os": "linux"})
    held = deploy(held_stack, Priority.NORMAL, at(2))
    claimable = deploy(make_stack(org, "free", {"os": "linux"}), Priority.LOW, at(3))
    won = [claim(group=group, now=at(4)), claim(group=group, now=at(5))]
    assert {str(c.run_id) for c in won if c} == {str(assigned.id), str(held.id)}
    # held's lease lapses; its runner still exists (One Runner Per Run): pending, but not claimable.
    services.run_reset_lease(run_id=held.id, now=at(4 + conf.get().assignment_ttl + 10))

    now = at(4 + conf.get().assignment_ttl + 20)
    found = entries(org, now)

    assert found[str(assigned.id)].reason["code"] == "runner_booting"
    assert found[str(queued.id)].reason["code"] == "waiting_for_lane"
    assert found[str(held.id)].reason["code"] == "previous_runner_alive"
    for run in (assigned, queued, held):
        entry = found[str(run.id)]
        assert (entry.position, entry.position_group_id, entry.expected_start_seconds) == (None, None, None)
    # The one claimable run is first in line, not behind those it cannot see.
    assert (found[str(claimable.id)].position, found[str(claimable.id)].position_group_name) == (1, "linux")
    # A queued run has not aged: its own priority.
    assert found[str(queued.id)].effective_priority == Priority.HIGH


def test_a_run_whose_only_group_is_drained_has_no_position(teammate_api: APIClient, unthrottled: Organization) -> None:
    org = unthrottled
    drained = make_group(org, "linux", {"os": "linux"})
    make_group(org, "mac", {"os": "macos"})  # undrained, but not a group for this run
    run = deploy(make_stack(org, "web", {"os": "linux"}), Priority.NORMAL, at(0))
    assert entries(org, at(1))[str(run.id)].position == 1
    services.runner_group_set_drained(group=drained, drained=True)

    entry = entries(org, at(2))[str(run.id)]

    assert (entry.position, entry.position_group_id) == (None, None)
    assert entry.reason["code"] == "groups_drained"
    api = queue_of(teammate_api)["runs"][0]
    assert (api["position"], api["position_group"], api["expected_start_seconds"]) == (None, None, None)


# ---------------------------------------------------------------- the estimate


def test_the_estimate_is_null_for_a_group_that_handed_out_nothing_recently(unthrottled: Organization) -> None:
    org = unthrottled
    window = conf.get().queue_rate_window
    group = make_group(org, "linux", {"os": "linux"}, max_concurrent_runs=1)
    early = deploy(make_stack(org, "early", {"os": "linux"}), Priority.NORMAL, at(0))
    first = claim(group=group, now=at(1))
    assert first is not None
    assert str(first.run_id) == str(early.id)
    release(first.run_id, first.runner_id, at(2))
    run = deploy(make_stack(org, "web", {"os": "linux"}), Priority.NORMAL, at(3))
    behind = deploy(make_stack(org, "api", {"os": "linux"}), Priority.NORMAL, at(4))

    # Within the window the one hand-out is a basis.
    assert entries(org, at(10))[str(behind.id)].expected_start_seconds is not None
    # Past it, the group handed out nothing recently: no basis, whatever its place.
    later = entries(org, at(1 + window + 2 * metrics.HANDOUT_BUCKET))
    assert [later[str(r.id)].position for r in (run, behind)] == [1, 2]
    assert [later[str(r.id)].expected_start_seconds for r in (run, behind)] == [None, None]


def test_the_estimate_is_within_a_factor_of_two_of_the_actual_start_for_a_steady_stream(
    unthrottled: Organization,
) -> None:
    """A one-slot group takes a run every 20 s (each goes before the next poll); after a window of that, each
    waiting run's estimate is checked against when the same stream actually takes it."""
    org = unthrottled
    period, window = 20, conf.get().queue_rate_window
    group = make_group(org, "steady", {"os": "linux"}, max_concurrent_runs=1)
    backlog = [deploy(make_stack(org, f"s{i}", {"os": "linux"}), Priority.NORMAL, at(i)) for i in range(60)]
    t = 100

    def step() -> str:
        nonlocal t
        won = claim(group=group, now=at(t))
        assert won is not None
        release(won.run_id, won.runner_id, at(t + 1))
        t += period
        return str(won.run_id)

    while t < 100 + window + period:  # a full window of history
        step()
    read_at = t - period // 2  # half way between two polls
    found = entries(org, at(read_at))
    estimates = {
        run_id: e.expected_start_seconds for run_id, e in found.items() if e.expected_start_seconds is not None
    }
    assert len(estimates) == len([e for e in found.values() if e.position is not None]) >= 20
    started: dict[str, int] = {}
    while len(started) < 20:
        at_t = t
        started[step()] = at_t - read_at
    checked = 0
    for run_id, actual in started.items():
        estimate = estimates[run_id]
        if estimate > 0:
            assert estimate / 2 <= actual <= estimate * 2, (run_id, estimate, actual)
            checked += 1
    assert checked >= 19
    assert str(backlog[-1].id) not in started


# ---------------------------------------------------------------- the read stays a fixed number of statements


@pytest.mark.parametrize("waiting", [10, 10_000])
def test_the_queue_read_is_three_statements_at_10_and_at_10000_waiting_runs(
    unthrottled: Organization, waiting: int
) -> None:
    """The page, the groups, the page's positions: three statements (and one Redis read of hand-outs) for a
    page of 500, whether 10 runs wait or 10,000, in mixed priorities."""
    org = unthrottled
    make_group(org, "linux", {"os": "linux"}, max_concurrent_runs=50)
    made = bulk_backlog(org, stacks=waiting // 10, queued_per_stack=9, selector={"os": "linux"})
    assert made == waiting
    with connection.cursor() as cur:
        cur.execute("UPDATE run SET priority = abs(hashtext(id::text)) %% 3 WHERE organization_id = %s", [org.id])
    if waiting > 10:
        assert Run.objects.filter(organization=org).values("priority").distinct().count() == 3

    with CaptureQueriesContext(connection) as queries:
        page = queue.read_queue(org=org, now=timezone.now(), limit=500)

    assert len(page.entries) == min(500, waiting)
    assert len(queries) == 3, [q["sql"][:80] for q in queries]
    placed = [e for e in page.entries if e.position is not None]
    assert placed
    assert all(e.run.status == RunStatus.PENDING for e in placed)
