"""deployment_create: the first run takes the lane, later ones queue; selectors are shared and snapshotted."""

from __future__ import annotations

from typing import Any

import pytest

from gantry.core import services
from gantry.core.errors import InvalidRequest
from gantry.core.models import (
    Deployment,
    DeploymentStatus,
    Organization,
    Run,
    RunEvent,
    RunSelector,
    RunStatus,
    Stack,
)
from tests.conftest import SPEC
from tests.core.drive import at, deploy, deployment_status, event_kinds


def test_it_makes_the_first_run_pending_and_stamps_first_pending_at(stack: Stack) -> None:
    deployment = services.deployment_create(stack=stack, now=at(0))

    run = Run.objects.get(deployment=deployment)
    assert deployment.status == DeploymentStatus.QUEUED
    assert run.status == RunStatus.PENDING
    assert run.first_pending_at == at(0)
    assert run.created_at == at(0)
    assert run.attempt == 1
    assert run.organization_id == stack.organization_id
    assert run.assigned_runner_id is None
    assert run.started_at is None
    assert deployment.spec == SPEC
    assert event_kinds(run) == ["created"]
    assert RunEvent.objects.get(run=run).detail == {"status": "pending", "attempt": 1}


def test_it_queues_later_runs_while_the_lane_is_held(stack: Stack) -> None:
    first = deploy(stack, now=at(0))
    second = deploy(stack, now=at(1))
    third = deploy(stack, now=at(2))

    assert first.status == RunStatus.PENDING
    for run in (second, third):
        assert run.status == RunStatus.QUEUED
        assert run.first_pending_at is None
        assert deployment_status(run) == DeploymentStatus.QUEUED
        assert event_kinds(run) == ["created"]
    # Queueing never disturbs the holder.
    first.refresh_from_db()
    assert first.status == RunStatus.PENDING
    assert first.first_pending_at == at(0)


def test_it_keeps_lanes_of_different_stacks_apart(acme: Organization, stack: Stack) -> None:
    other = services.stack_create(org=acme, name="other", labels={"gantry:runner-group:os": "linux"}, spec=SPEC)

    a = deploy(stack, now=at(0))
    b = deploy(other, now=at(1))

    assert a.status == RunStatus.PENDING
    assert b.status == RunStatus.PENDING


def test_it_uses_the_stack_spec_unless_one_is_given(stack: Stack) -> None:
    own = {"steps": [{"name": "build", "run": "make"}]}

    deployment = services.deployment_create(stack=stack, spec=own, now=at(0))

    # Stored in canonical form: optional keys filled in.
    assert deployment.spec == {"steps": [{"name": "build", "run": "make"}], "env": {}, "timeout_seconds": 3600}


def test_it_shares_one_selector_row_per_distinct_selector_per_org(acme: Organization, globex: Organization) -> None:
    def make(org: Organization, name: str, labels: dict[str, str]) -> Run:
        stack = services.stack_create(org=org, name=name, labels=labels, spec=SPEC)
        return deploy(stack, now=at(0))

    a = make(acme, "a", {"gantry:runner-group:os": "linux", "gantry:runner-group:arch": "amd64"})
    # Same selector, keys in another order, plus a free label that plays no part in matching.
    b = make(acme, "b", {"gantry:runner-group:arch": "amd64", "gantry:runner-group:os": "linux", "team": "x"})
    c = make(acme, "c", {"gantry:runner-group:os": "linux"})
    # Same selector as a, but another organization: its own row.
    d = make(globex, "d", {"gantry:runner-group:os": "linux", "gantry:runner-group:arch": "amd64"})
    # A second run on stack a reuses the row too.
    a2 = deploy(Stack.objects.get(id=a.stack_id), now=at(1))

    assert a.runner_selector == {"os": "linux", "arch": "amd64"}
    assert b.runner_selector == {"os": "linux", "arch": "amd64"}
    assert a.selector_id == b.selector_id == a2.selector_id
    assert c.selector_id != a.selector_id
    assert d.selector_id != a.selector_id
    assert RunSelector.objects.filter(organization=acme).count() == 2
    assert RunSelector.objects.filter(organization=globex).count() == 1
    assert RunSelector.objects.get(id=a.selector_id).selector == {"os": "linux", "arch": "amd64"}
    assert RunSelector.objects.get(id=d.selector_id).organization_id == globex.id


def test_it_snapshots_the_selector_so_later_label_changes_do_not_touch_existing_runs(stack: Stack) -> None:
    old = deploy(stack, now=at(0))
    old_selector_id = old.selector_id

    services.stack_update(stack=stack, labels={"gantry:runner-group:os": "windows"})
    new = deploy(Stack.objects.get(id=stack.id), now=at(1))

    old.refresh_from_db()
    assert old.runner_selector == {"os": "linux"}
    assert old.selector_id == old_selector_id
    assert RunSelector.objects.get(id=old.selector_id).selector == {"os": "linux"}
    assert new.runner_selector == {"os": "windows"}
    assert new.selector_id != old_selector_id


def test_it_gives_a_stack_without_selector_labels_the_empty_selector(acme: Organization) -> None:
    plain = services.stack_create(org=acme, name="plain", labels={"team": "ops"}, spec=SPEC)
    bare = services.stack_create(org=acme, name="bare", spec=SPEC)

    a = deploy(plain, now=at(0))
    b = deploy(bare, now=at(0))

    assert a.runner_selector == {}
    assert b.runner_selector == {}
    assert a.selector_id == b.selector_id
    assert RunSelector.objects.get(id=a.selector_id).selector == {}
    assert a.status == b.status == RunStatus.PENDING


BAD_SPECS: list[Any] = [
    [],
    "echo hi",
    {},
    {"steps": []},
    {"steps": [{"name": "x"}]},
    {"steps": [{"name": "", "run": "true"}]},
    {"steps": [{"name": "x", "run": "   "}]},
    {"steps": [{"name": "x", "run": "true", "shell": "zsh"}]},
    {"steps": [{"name": "x", "run": "true"}], "timout_seconds": 10},
    {"steps": [{"name": "x", "run": "true"}], "env": {"A": 1}},
    {"steps": [{"name": "x", "run": "true"}], "env": {"A=B": "1"}},
    {"steps": [{"name": "x", "run": "true"}], "timeout_seconds": 0},
    {"steps": [{"name": "x", "run": "true"}], "timeout_seconds": True},
    {"steps": [{"name": "x", "run": "true"}], "timeout_seconds": "60"},
]


def _nothing_created() -> None:
    assert Deployment.objects.count() == 0
    assert Run.objects.count() == 0
    assert RunEvent.objects.count() == 0
    assert RunSelector.objects.count() == 0


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_it_refuses_an_invalid_spec_and_creates_nothing(stack: Stack, spec: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        services.deployment_create(stack=stack, spec=spec, now=at(0))

    assert exc.value.code == "invalid_request"
    assert exc.value.http_status == 400
    _nothing_created()


def test_it_refuses_a_deployment_without_any_spec_and_creates_nothing(acme: Organization) -> None:
    specless = services.stack_create(org=acme, name="specless")

    with pytest.raises(InvalidRequest, match="no default spec"):
        services.deployment_create(stack=specless, now=at(0))

    _nothing_created()


def test_it_refuses_an_invalid_spec_without_disturbing_the_queue(stack: Stack) -> None:
    holder = deploy(stack, now=at(0))
    events = RunEvent.objects.count()

    with pytest.raises(InvalidRequest):
        services.deployment_create(stack=stack, spec={"steps": "nope"}, now=at(1))

    assert list(Run.objects.values_list("id", flat=True)) == [holder.id]
    assert Deployment.objects.count() == 1
    assert RunEvent.objects.count() == events
