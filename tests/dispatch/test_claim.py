"""The poll's claim (docs/design.md §5, "Phase 1: Poll", "Selector Matching", "One Runner Per Run").

Every test goes through ``gantry.dispatch.claim.claim`` and ``gantry.core.services``
with explicit times, so ordering never depends on the wall clock.
"""

from __future__ import annotations

import pytest
from django.db import connection

from gantry.core import services
from gantry.core.errors import Conflict
from gantry.core.models import Organization, Run, RunEvent, Runner, RunnerGroup, RunnerStatus, RunStatus, Stack
from gantry.dispatch.claim import claim
from tests.dispatch.helpers import at, deploy, make_group, make_stack, runner_count, ttl

pytestmark = pytest.mark.django_db


def status_of(run: Run) -> str:
    return Run.objects.values_list("status", flat=True).get(id=run.id)


# ---------------------------------------------------------------- order


def test_it_claims_the_oldest_pending_run_by_first_pending_at_not_created_at(
    acme: Organization, group: RunnerGroup
) -> None:
    s1 = make_stack(acme, "s1", {"os": "linux"})
    s2 = make_stack(acme, "s2", {"os": "linux"})
    r0 = deploy(s1, now=at(0))  # holds s1's lane
    r1 = deploy(s1, now=at(1))  # queued behind r0: created early, pending late
    r2 = deploy(s2, now=at(2))  # created after r1, pending before it
    assert (r0.status, r1.status, r2.status) == (RunStatus.PENDING, RunStatus.QUEUED, RunStatus.PENDING)

    first = claim(group=group, now=at(3))
    assert first is not None
    assert first.run_id == r0.id
    services.run_accept(run_id=r0.id, runner_id=first.runner_id, now=at(4))
    services.run_finish(run_id=r0.id, outcome="succeeded", exit_code=0, now=at(5))  # promotes r1
    r1.refresh_from_db()
    assert r1.status == RunStatus.PENDING
    assert r1.first_pending_at == at(5)
    assert r1.created_at < r2.created_at  # created_at order would pick r1

    second = claim(group=group, now=at(6))
    third = claim(group=group, now=at(7))
    assert second is not None
    assert third is not None
    assert (second.run_id, third.run_id) == (r2.id, r1.id)


def test_it_keeps_a_requeued_runs_place_through_a_lease_reset_cycle(acme: Organization, group: RunnerGroup) -> None:
    old = deploy(make_stack(acme, "old", {"os": "linux"}), now=at(0))
    first = claim(group=group, now=at(1))
    assert first is not None
    assert first.run_id == old.id
    newer = deploy(make_stack(acme, "newer", {"os": "linux"}), now=at(2))

    lapsed = at(1) + ttl() + ttl()
    services.run_reset_lease(run_id=old.id, now=lapsed)
    services.runner_deregister(runner_id=first.runner_id, now=lapsed)
    old.refresh_from_db()
    assert old.status == RunStatus.PENDING
    assert old.assigned_runner_id is None
    assert old.first_pending_at == at(0)  # preserved across the re-queue
    assert old.updated_at > Run.objects.get(id=newer.id).updated_at

    again = claim(group=group, now=lapsed)
    assert again is not None
    assert again.run_id == old.id
    assert again.runner_id != first.runner_id
    assert status_of(newer) == RunStatus.PENDING


# ---------------------------------------------------------------- selectors


def test_it_serves_a_selector_contained_in_the_groups_labels(acme: Organization, group: RunnerGroup) -> None:
    run = deploy(make_stack(acme, "web", {"os": "linux"}), now=at(0))
    result = claim(group=group, now=at(1))
    assert result is not None
    assert result.run_id == run.id


def test_it_does_not_serve_a_selector_the_group_lacks(acme: Organization, group: RunnerGroup) -> None:
    run = deploy(make_stack(acme, "mac", {"os": "mac"}), now=at(0))
    assert claim(group=group, now=at(1)) is None
    assert status_of(run) == RunStatus.PENDING
    assert not Runner.objects.exists()
    assert runner_count(group) == 0


def test_it_needs_every_pair_of_a_two_key_selector(acme: Organization) -> None:
    only_os = make_group(acme, "only-os", {"os": "linux"})
    wrong_arch = make_group(acme, "wrong-arch", {"os": "linux", "arch": "arm64"})
    both = make_group(acme, "both", {"os": "linux", "arch": "amd64", "gpu": "none"})
    run = deploy(make_stack(acme, "web", {"os": "linux", "arch": "amd64"}), now=at(0))

    assert claim(group=only_os, now=at(1)) is None
    assert claim(group=wrong_arch, now=at(2)) is None
    assert status_of(run) == RunStatus.PENDING
    result = claim(group=both, now=at(3))
    assert result is not None
    assert result.run_id == run.id


def test_it_gives_an_empty_selector_only_to_the_orgs_default_group(acme: Organization) -> None:
    default = make_group(acme, "default", {"os": "linux"})
    other = make_group(acme, "other", {"os": "linux"})
    services.org_update(org=acme, default_runner_group_id=default.id)
    run = deploy(make_stack(acme, "plain"), now=at(0))
    assert run.runner_selector == {}

    assert claim(group=other, now=at(1)) is None
    assert status_of(run) == RunStatus.PENDING
    result = claim(group=default, now=at(2))
    assert result is not None
    assert result.run_id == run.id


def test_it_still_serves_a_non_empty_selector_on_any_matching_group_when_a_default_is_set(
    acme: Organization,
) -> None:
    default = make_group(acme, "default", {"os": "linux"})
    other = make_group(acme, "other", {"os": "linux"})
    services.org_update(org=acme, default_runner_group_id=default.id)
    run = deploy(make_stack(acme, "web", {"os": "linux"}), now=at(0))
    result = claim(group=other, now=at(1))
    assert result is not None
    assert result.run_id == run.id


def test_it_gives_an_empty_selector_to_any_group_when_no_default_is_set(acme: Organization) -> None:
    unlabelled = make_group(acme, "bare", {})
    run = deploy(make_stack(acme, "plain"), now=at(0))
    assert Organization.objects.get(id=acme.id).default_runner_group_id is None
    result = claim(group=unlabelled, now=at(1))
    assert result is not None
    assert result.run_id == run.id


def test_it_never_claims_another_orgs_run(acme: Organization, globex: Organization, group: RunnerGroup) -> None:
    theirs = deploy(make_stack(globex, "theirs", {"os": "linux"}), now=at(0))
    deploy(make_stack(globex, "theirs-plain"), now=at(0))
    assert claim(group=group, now=at(1)) is None
    assert status_of(theirs) == RunStatus.PENDING

    ours = deploy(make_stack(acme, "ours", {"os": "linux"}), now=at(2))  # newer than theirs
    result = claim(group=group, now=at(3))
    assert result is not None
    assert result.run_id == ours.id
    assert claim(group=group, now=at(4)) is None
    assert Run.objects.filter(organization=globex, status=RunStatus.PENDING).count() == 2


# ---------------------------------------------------------------- group state


def test_it_claims_nothing_for_a_drained_group_but_stamps_its_poll(acme: Organization, group: RunnerGroup) -> None:
    run = deploy(make_stack(acme, "web", {"os": "linux"}), now=at(0))
    services.runner_group_set_drained(group=group, drained=True)

    assert claim(group=group, now=at(5)) is None
    assert RunnerGroup.objects.get(id=group.id).last_polled_at == at(5)
    assert status_of(run) == RunStatus.PENDING
    assert not Runner.objects.exists()

    services.runner_group_set_drained(group=group, drained=False)
    result = claim(group=group, now=at(6))
    assert result is not None
    assert result.run_id == run.id
    assert RunnerGroup.objects.get(id=group.id).last_polled_at == at(6)


def test_it_respects_max_concurrent_runs_and_a_deleted_runner_frees_a_slot(acme: Organization) -> None:
    small = make_group(acme, "small", {"os": "linux"}, max_concurrent_runs=2)
    runs = [deploy(make_stack(acme, f"s{i}", {"os": "linux"}), now=at(i)) for i in range(4)]

    first = claim(group=small, now=at(10))
    second = claim(group=small, now=at(11))
    assert first is not None
    assert second is not None
    assert claim(group=small, now=at(12)) is None  # both slots taken: runner rows are slots
    assert Runner.objects.filter(runner_group=small).count() == 2
    assert runner_count(small) == 2
    assert [status_of(r) for r in runs[2:]] == [RunStatus.PENDING, RunStatus.PENDING]

    # The first runner's lease lapses and it deregisters: its row (the slot) goes.
    lapsed = at(10) + ttl() + ttl()
    services.run_reset_lease(run_id=first.run_id, now=lapsed)
    services.runner_deregister(runner_id=first.runner_id, now=lapsed)
    assert runner_count(small) == 1

    third = claim(group=small, now=lapsed)
    assert third is not None
    assert third.run_id == runs[0].id  # released and still the oldest
    assert claim(group=small, now=lapsed) is None
    assert Runner.objects.filter(runner_group=small).count() == 2
    assert runner_count(small) == 2


def test_it_frees_a_slot_when_a_stub_is_deleted_by_a_dispatch_failure(acme: Organization) -> None:
    one = make_group(acme, "one", {"os": "linux"}, max_concurrent_runs=1)
    a = deploy(make_stack(acme, "a", {"os": "linux"}), now=at(0))
    b = deploy(make_stack(acme, "b", {"os": "linux"}), now=at(1))
    got = claim(group=one, now=at(2))
    assert got is not None
    assert got.run_id == a.id
    assert claim(group=one, now=at(3)) is None

    services.dispatch_failed(group=one, run_id=a.id, runner_id=got.runner_id, error="spawn failed", now=at(4))
    assert runner_count(one) == 0
    nxt = claim(group=one, now=at(5))
    assert nxt is not None
    assert nxt.run_id == b.id


# ---------------------------------------------------------------- what a claim writes


def test_it_creates_a_not_ready_stub_and_assigns_the_run_with_a_lease(acme: Organization, group: RunnerGroup) -> None:
    run = deploy(make_stack(acme, "web", {"os": "linux"}), now=at(0))
    result = claim(group=group, now=at(7))
    assert result is not None

    stub = Runner.objects.get(id=result.runner_id)
    assert stub.status == RunnerStatus.NOT_READY
    assert stub.runner_group_id == group.id
    run.refresh_from_db()
    assert run.status == RunStatus.ASSIGNED
    assert run.assigned_runner_id == stub.id
    assert run.assigned_at == at(7)
    assert run.assigned_expires_at == at(7) + ttl()
    assert result.assigned_expires_at == at(7) + ttl()
    assert result.runner_token
    events = list(RunEvent.objects.filter(run_id=run.id, kind="assigned"))
    assert len(events) == 1
    assert events[0].at == at(7)
    assert events[0].detail == {"runner_id": str(stub.id), "runner_group_id": group.id}
    assert runner_count(group) == 1


def test_it_answers_none_and_writes_nothing_without_work(acme: Organization, group: RunnerGroup) -> None:
    assert claim(group=group, now=at(1)) is None
    assert not Runner.objects.exists()
    assert not RunEvent.objects.filter(kind="assigned").exists()
    assert runner_count(group) == 0


# ---------------------------------------------------------------- one runner per run


def test_it_never_claims_a_pending_run_whose_runner_still_exists(acme: Organization, group: RunnerGroup) -> None:
    second_group = make_group(acme, "second", {"os": "linux"})
    run = deploy(make_stack(acme, "web", {"os": "linux"}), now=at(0))
    first = claim(group=group, now=at(1))
    assert first is not None

    lapsed = at(1) + ttl() + ttl()
    services.run_reset_lease(run_id=run.id, now=lapsed)
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    assert run.assigned_runner_id == first.runner_id  # the pointer is kept

    assert claim(group=group, now=lapsed) is None
    assert claim(group=second_group, now=lapsed) is None
    assert Runner.objects.count() == 1

    services.runner_deregister(runner_id=first.runner_id, now=lapsed)
    run.refresh_from_db()
    assert run.assigned_runner_id is None
    again = claim(group=second_group, now=lapsed)
    assert again is not None
    assert again.run_id == run.id
    assert again.runner_id != first.runner_id
    assert Runner.objects.get(id=again.runner_id).runner_group_id == second_group.id


def test_it_does_not_let_a_runner_deregister_while_its_lease_holds(acme: Organization, group: RunnerGroup) -> None:
    deploy(make_stack(acme, "web", {"os": "linux"}), now=at(0))
    result = claim(group=group, now=at(1))
    assert result is not None
    with pytest.raises(Conflict):
        services.runner_deregister(runner_id=result.runner_id, now=at(2))
    assert runner_count(group) == 1


def test_it_keeps_runner_count_equal_to_the_runner_rows(acme: Organization) -> None:
    g1 = make_group(acme, "g1", {"os": "linux"}, max_concurrent_runs=50)
    g2 = make_group(acme, "g2", {"os": "linux"}, max_concurrent_runs=50)
    stacks: list[Stack] = [make_stack(acme, f"s{i}", {"os": "linux"}) for i in range(6)]
    for i, s in enumerate(stacks):
        deploy(s, now=at(i))
    claims = [claim(group=g, now=at(10 + i)) for i, g in enumerate([g1, g2, g1, g2, g1])]
    assert all(c is not None for c in claims)

    def check() -> None:
        for g in (g1, g2):
            assert runner_count(g) == Runner.objects.filter(runner_group=g).count()

    check()
    assert (runner_count(g1), runner_count(g2)) == (3, 2)
    lapsed = at(100) + ttl()
    for c in claims[:3]:
        assert c is not None
        services.run_reset_lease(run_id=c.run_id, now=lapsed)
        services.runner_deregister(runner_id=c.runner_id, now=lapsed)
    check()
    assert (runner_count(g1), runner_count(g2)) == (1, 1)
    assert claim(group=g2, now=lapsed) is not None
    check()
    assert (runner_count(g1), runner_count(g2)) == (1, 2)


def test_runner_count_counts_claimed_stubs_and_every_other_insert_move_and_delete_once(acme: Organization) -> None:
    g1 = make_group(acme, "g1", {"os": "linux"}, max_concurrent_runs=50)
    g2 = make_group(acme, "g2", {"os": "linux"}, max_concurrent_runs=50)
    deploy(make_stack(acme, "s", {"os": "linux"}), now=at(0))

    won = claim(group=g1, now=at(1))  # counted by the claim statement itself
    assert won is not None
    orm = Runner.objects.create(runner_group=g1)  # counted by the insert trigger
    with connection.cursor() as cur:  # so is raw SQL that does not set the flag
        cur.execute(
            "INSERT INTO runner (id, runner_group_id, status, hostname, launcher, container_id, pod_name) "
            "VALUES (gen_random_uuid(), %s, 'ready', '', '', '', '')",
            [g2.id],
        )

    assert Runner.objects.get(id=won.runner_id).claim_counted is True
    assert Runner.objects.get(id=orm.id).claim_counted is False
    assert (runner_count(g1), runner_count(g2)) == (2, 1)

    Runner.objects.filter(id=won.runner_id).update(runner_group=g2)  # a move, by the update trigger
    assert (runner_count(g1), runner_count(g2)) == (1, 2)
    Runner.objects.filter(id=won.runner_id).delete()  # a claimed stub's delete counts like any other
    orm.delete()
    assert (runner_count(g1), runner_count(g2)) == (0, 1)
    for g in (g1, g2):
        assert runner_count(g) == Runner.objects.filter(runner_group=g).count()


@pytest.mark.parametrize("verdict", ["stands", "refused"])
def test_a_vouch_read_decides_whether_the_claim_stands_inside_a_callers_transaction(
    acme: Organization, group: RunnerGroup, verdict: str
) -> None:
    from gantry.api.auth import group_check, group_of_row
    from gantry.core import tokens
    from gantry.dispatch.claim import Vouch

    run = deploy(make_stack(acme, "web", {"os": "linux"}))
    token = tokens.mint_group_token(
        group_id=group.id, token_version=group.token_version + (verdict == "refused"), organization_id=acme.id
    )
    claims = tokens.decode(token)
    checked = group_check(claims)
    assert checked is not None
    stand_in, (statement, args) = checked
    seen: list[object] = []

    def check(row: tuple[object, ...] | None) -> None:
        seen.append(group_of_row(claims, row))  # raises AuthenticationFailed for the wrong version

    vouch = Vouch(statement, args, check=check)
    if verdict == "stands":
        won = claim(group=stand_in, vouch=vouch)
        assert won is not None
        assert won.run_id == run.id
        assert seen[0].id == group.id  # type: ignore[attr-defined]
    else:
        from rest_framework.exceptions import AuthenticationFailed

        with pytest.raises(AuthenticationFailed):
            claim(group=stand_in, vouch=vouch)
        assert Run.objects.get(id=run.id).status == RunStatus.PENDING
        assert not Runner.objects.exists()
