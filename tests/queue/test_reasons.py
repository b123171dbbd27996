"""GET /orgs/{org}/queue: one test per reason code, each situation built for real, and the ladder's order."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone
from rest_framework.test import APIClient

from gantry import conf
from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus, Stack
from gantry.dispatch import queue, throttle
from gantry.dispatch.claim import claim as dispatch_claim
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.queue.helpers import poll, reason_of, spend_budget

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_buckets")]


def test_the_codes_are_the_documented_ladder() -> None:
    assert queue.CODES == (
        "waiting_for_lane",
        "runner_booting",
        "previous_runner_alive",
        "no_matching_group",
        "groups_drained",
        "org_throttled",
        "org_in_flight_cap",
        "behind_higher_priority",
        "groups_at_capacity",
        "no_runner_polling",
        "dispatchable",
    )


def test_waiting_for_lane(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    holder = deploy(stack)
    behind = deploy(stack)
    assert behind.status == RunStatus.QUEUED

    reason = reason_of(teammate_api, behind)

    assert reason["code"] == "waiting_for_lane"
    assert reason["lane_holder_run_id"] == str(holder.id)
    assert str(holder.id) in reason["detail"]
    assert "web" in reason["detail"]


def test_runner_booting(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack)
    claim = poll(group)
    assert claim is not None
    assert claim["run_id"] == str(run.id)

    reason = reason_of(teammate_api, run)

    assert reason["code"] == "runner_booting"
    assert reason["runner_id"] == claim["runner_id"]
    assert reason["lease_expires_at"] == Run.objects.get(id=run.id).assigned_expires_at.isoformat()


def test_previous_runner_alive(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack)
    claim = poll(group)
    assert claim is not None
    lease_end = Run.objects.get(id=run.id).assigned_expires_at
    # The lease lapses; the reaper resets the run and keeps its runner pointer (One Runner Per Run).
    services.run_reset_lease(run_id=run.id, now=lease_end + timedelta(seconds=1))
    runner = Runner.objects.get(id=claim["runner_id"])

    reason = reason_of(teammate_api, run)

    assert reason["code"] == "previous_runner_alive"
    assert reason["runner_id"] == str(runner.id)
    expected = runner.created_at + timedelta(seconds=conf.get().stub_cutoff)
    assert reason["reaped_after"] == expected.isoformat()
    # And the claim agrees: the group, with free slots, does not take it again.
    assert poll(group) is None
    # Once the runner deregisters the run is dispatchable again.
    services.runner_deregister(runner_id=runner.id)
    assert reason_of(teammate_api, run)["code"] == "dispatchable"


def test_no_matching_group(teammate_api: APIClient, acme: Organization, group: RunnerGroup) -> None:
    gpu = make_stack(acme, "train", {"os": "linux", "gpu": "a100"})
    make_group(acme, "mac", {"os": "macos"})
    run = deploy(gpu)

    reason = reason_of(teammate_api, run)

    assert reason["code"] == "no_matching_group"
    assert reason["closest_group_id"] == group.id  # linux lacks only gpu; mac lacks both
    assert reason["missing_labels"] == {"gpu": "a100"}
    assert "linux" in reason["detail"]
    assert "gpu=a100" in reason["detail"]
    assert poll(group) is None


def test_no_matching_group_when_the_org_has_no_group(teammate_api: APIClient, stack: Stack) -> None:
    reason = reason_of(teammate_api, deploy(stack))
    assert reason["code"] == "no_matching_group"
    assert reason["detail"] == "This org has no runner group."


def test_an_empty_selector_matches_only_the_default_group(
    owner_api: APIClient, acme: Organization, group: RunnerGroup
) -> None:
    other = make_group(acme, "other", {"os": "linux"})
    anywhere = make_stack(acme, "anywhere")
    services.org_update(org=acme, default_runner_group_id=other.id)
    run = deploy(anywhere)
    services.runner_group_set_drained(group=other, drained=True)

    # Only the default group may take it, and it is drained: the undrained group does not count.
    assert reason_of(owner_api, run)["code"] == "groups_drained"
    assert reason_of(owner_api, run)["group_ids"] == [other.id]
    assert poll(group) is None


def test_groups_drained(owner_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    assert owner_api.post(f"/api/v1/runner-groups/{group.id}/drain").status_code == 200
    run = deploy(stack)

    reason = reason_of(owner_api, run)

    assert reason["code"] == "groups_drained"
    assert reason["group_ids"] == [group.id]
    assert "linux" in reason["detail"]


def test_org_throttled(teammate_api: APIClient, acme: Organization, stack: Stack, group: RunnerGroup) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    spend_budget(acme)
    poll(group)  # a fresh poll, so only the budget holds the run back
    run = deploy(stack)

    reason = reason_of(teammate_api, run)

    assert reason["code"] == "org_throttled"
    budget = teammate_api.get("/api/v1/orgs/acme/dispatch-budget").json()
    assert budget["throttled"] is True
    # The next slot is the budget API's, to the second (both read the same bucket a moment apart).
    assert abs(
        timezone.datetime.fromisoformat(reason["until"]) - timezone.datetime.fromisoformat(budget["next_slot_at"])
    ) < timedelta(seconds=2)
    assert "(1 run per hour)" in reason["detail"]  # not "1 runs"
    assert re.search(r"\(in \d+ (s|min|h)( \d+ min)?\)\.$", reason["detail"]), reason[
        "detail"
    ]  # in words, not "3526 s"
    assert poll(group) is None  # the claim is throttled too


def test_org_throttled_at_rate_zero_has_no_next_slot(
    teammate_api: APIClient, acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=0)
    reason = reason_of(teammate_api, deploy(stack))
    assert reason["code"] == "org_throttled"
    assert reason["until"] is None


def test_groups_at_capacity(teammate_api: APIClient, acme: Organization, stack: Stack) -> None:
    small = make_group(acme, "small", {"os": "linux"}, max_concurrent_runs=1)
    first = deploy(make_stack(acme, "first", {"os": "linux"}))
    assert poll(small)["run_id"] == str(first.id)  # type: ignore[index]
    run = deploy(stack)

    reason = reason_of(teammate_api, run)

    assert reason["code"] == "groups_at_capacity"
    assert reason["group_ids"] == [small.id]
    assert "small 1/1" in reason["detail"]
    assert poll(small) is None


def _github_group(org: Organization, name: str, **fields: object) -> RunnerGroup:
    group, _token = services.runner_group_create(
        org=org,
        name=name,
        kind="github_actions",
        labels={"os": "linux"},
        github_owner="acme-inc",
        github_repo="deploys",
        github_workflow="gantry-runner.yml",
        github_ref="main",
        **fields,
    )
    return group


def test_org_in_flight_cap(teammate_api: APIClient, acme: Organization, stack: Stack) -> None:
    """The backend dispatcher's cap: the org already has max_in_flight runs out on its GitHub groups."""
    Organization.objects.filter(id=acme.id).update(max_in_flight=1)
    actions = _github_group(acme, "actions")
    first = deploy(make_stack(acme, "first", {"os": "linux"}))
    assert dispatch_claim(group=actions) is not None  # the dispatcher's claim: one run in flight
    assert Run.objects.get(id=first.id).status == RunStatus.ASSIGNED
    run = deploy(stack)

    reason = reason_of(teammate_api, run)

    assert reason["code"] == "org_in_flight_cap"
    assert (reason["in_flight"], reason["cap"], reason["group_ids"]) == (1, 1, [actions.id])
    assert "cap" in reason["detail"]


def test_a_dispatched_runs_page_names_its_github_group_and_links_its_workflow_run(
    acme: Organization, owner: object, stack: Stack
) -> None:
    from django.test import Client

    actions = _github_group(acme, "actions")
    run = deploy(stack)
    got = dispatch_claim(group=actions)
    assert got is not None
    url = "https://github.com/acme-inc/deploys/actions/runs/987654"
    services.github_runner_dispatched(
        runner_id=got.runner_id, workflow_path=".github/workflows/gantry-runner.yml", workflow_run_id=987654,
        workflow_run_url=url,
    )  # fmt: skip
    browser = Client()
    browser.login(username="owner", password="pw-owner")

    page = browser.get(f"/runs/{run.id}").content.decode()

    assert "actions</strong> (github_actions)" in page
    assert f'href="{url}"' in page
    assert "workflow run 987654" in page


def test_the_in_flight_cap_does_not_hold_a_run_a_self_hosted_group_can_take(
    teammate_api: APIClient, acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    Organization.objects.filter(id=acme.id).update(max_in_flight=1)
    actions = _github_group(acme, "actions")
    deploy(make_stack(acme, "first", {"os": "linux"}))
    assert dispatch_claim(group=actions) is not None
    run = deploy(stack)
    poll(group)  # the self-hosted coordinator is online (and finds nothing more: its poll took no run)

    assert reason_of(teammate_api, run)["code"] != "org_in_flight_cap"


def test_throttled_comes_before_the_in_flight_cap_and_the_cap_before_capacity(
    teammate_api: APIClient, acme: Organization, stack: Stack
) -> None:
    Organization.objects.filter(id=acme.id).update(max_in_flight=1)
    actions = _github_group(acme, "actions", max_concurrent_runs=1)  # at the cap *and* full
    deploy(make_stack(acme, "first", {"os": "linux"}))
    assert dispatch_claim(group=actions) is not None
    run = deploy(stack)
    assert reason_of(teammate_api, run)["code"] == "org_in_flight_cap"
    # The claim above spent one token of the budget: spend what is left.
    while throttle.take(organization_id=acme.id, rate=acme.runs_per_hour_limit).allowed:
        pass
    assert reason_of(teammate_api, run)["code"] == "org_throttled"


def test_no_runner_polling_for_a_group_that_never_polled(
    teammate_api: APIClient, stack: Stack, group: RunnerGroup
) -> None:
    reason = reason_of(teammate_api, deploy(stack))
    assert reason["code"] == "no_runner_polling"
    assert reason["group_ids"] == [group.id]
    assert reason["last_polled_at"] is None
    assert "never polled" in reason["detail"]


def test_no_runner_polling_for_a_silent_coordinator(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    stale = conf.get().poll_stale_after
    with time_machine.travel(timezone.now() - timedelta(seconds=stale + 30), tick=False):
        poll(group)
    polled = RunnerGroup.objects.get(id=group.id).last_polled_at

    reason = reason_of(teammate_api, deploy(stack))

    assert reason["code"] == "no_runner_polling"
    assert reason["last_polled_at"] == polled.isoformat()  # type: ignore[union-attr]
    assert f"last {stale} s" in reason["detail"]


def test_dispatchable(teammate_api: APIClient, stack: Stack, group: RunnerGroup) -> None:
    assert poll(group) is None  # the coordinator is polling; nothing yet
    run = deploy(stack)

    reason = reason_of(teammate_api, run)

    assert reason["code"] == "dispatchable"
    assert reason["group_ids"] == [group.id]
    assert reason["detail"] == "Nothing holds it back: the next poll of linux takes it (in priority order)."
    # The next poll takes exactly this run.
    claim = poll(group)
    assert claim is not None
    assert claim["run_id"] == str(run.id)


# ---------------------------------------------------------------- the ladder's order


def test_a_queued_run_waits_for_its_lane_whatever_else_holds(
    owner_api: APIClient, stack: Stack, group: RunnerGroup
) -> None:
    deploy(stack)
    behind = deploy(stack)
    services.runner_group_set_drained(group=group, drained=True)
    assert reason_of(owner_api, behind)["code"] == "waiting_for_lane"


def test_drained_comes_before_throttled_and_throttled_before_capacity(
    owner_api: APIClient, acme: Organization, stack: Stack
) -> None:
    small = make_group(acme, "small", {"os": "linux"}, max_concurrent_runs=1)
    first = deploy(make_stack(acme, "first", {"os": "linux"}))
    assert poll(small) is not None
    assert Run.objects.get(id=first.id).status == RunStatus.ASSIGNED
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    spend_budget(acme)
    services.runner_group_set_drained(group=small, drained=True)
    run = deploy(stack)

    # drained, throttled and full at once: drained wins
    assert reason_of(owner_api, run)["code"] == "groups_drained"
    # undrained: throttled and full; throttled wins
    services.runner_group_set_drained(group=small, drained=False)
    assert reason_of(owner_api, run)["code"] == "org_throttled"
    # a super-admin raises the rate (a token every 3.6 ms): only capacity is left
    services.org_set_runs_per_hour_limit(org=acme, limit=1_000_000)
    assert reason_of(owner_api, run)["code"] == "groups_at_capacity"


def test_no_matching_group_comes_before_throttled(owner_api: APIClient, acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=0)
    run = deploy(make_stack(acme, "nowhere", {"os": "plan9"}))
    assert reason_of(owner_api, run)["code"] == "no_matching_group"


def test_capacity_comes_before_polling(teammate_api: APIClient, acme: Organization, stack: Stack) -> None:
    small = make_group(acme, "small", {"os": "linux"}, max_concurrent_runs=1)
    deploy(make_stack(acme, "first", {"os": "linux"}))
    stale = conf.get().poll_stale_after
    with time_machine.travel(timezone.now() - timedelta(seconds=stale + 30), tick=False):
        assert poll(small) is not None  # took the slot, then went silent
    assert reason_of(teammate_api, deploy(stack))["code"] == "groups_at_capacity"


def test_one_group_with_free_slots_and_a_recent_poll_makes_it_dispatchable(
    teammate_api: APIClient, acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    drained = make_group(acme, "drained", {"os": "linux"})
    services.runner_group_set_drained(group=drained, drained=True)
    poll(group)
    reason = reason_of(teammate_api, deploy(stack))
    assert reason == {**reason, "code": "dispatchable", "group_ids": [group.id]}
