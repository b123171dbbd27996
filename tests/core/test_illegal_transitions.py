"""A terminal run never changes again; a transition from the wrong state is refused and changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from gantry.core import services
from gantry.core.errors import Conflict, InvalidTransition, RunTerminal
from gantry.core.models import Deployment, Run, Runner, RunnerGroup, RunStatus, Stack
from tests.core.drive import (
    TERMINAL_RECIPES,
    Driven,
    at,
    deploy,
    drive,
    event_count,
    expected_status,
    new_runner,
    row,
    token_row,
)

# Each service transition, called on a driven run. ``later`` is well past any lease or deadline.
LATER = at(minutes=600)
# Each takes the driven run and a spare runner (created before the "nothing changed" snapshot).
Op = Callable[[Driven, Runner], Any]


def _accept(d: Driven, spare: Runner) -> Any:
    runner_id = d.runner.id if d.runner is not None else spare.id
    return services.run_accept(run_id=d.run.id, runner_id=runner_id, now=LATER)


OPS: dict[str, Op] = {
    "assign": lambda d, spare: services.run_assign(run_id=d.run.id, runner=spare, now=LATER),
    "reset_lease": lambda d, spare: services.run_reset_lease(run_id=d.run.id, now=LATER),
    "accept": _accept,
    "acknowledge_cancel": lambda d, spare: services.run_acknowledge_cancel(run_id=d.run.id, now=LATER),
    "finish_succeeded": lambda d, spare: services.run_finish(run_id=d.run.id, outcome="succeeded", now=LATER),
    "finish_failure": lambda d, spare: services.run_finish(run_id=d.run.id, outcome="failure", exit_code=1, now=LATER),
    "finish_cancelled": lambda d, spare: services.run_finish(run_id=d.run.id, outcome="cancelled", now=LATER),
    "fail": lambda d, spare: services.run_fail(run_id=d.run.id, reason="lost", now=LATER),
    "startup_timeout": lambda d, spare: services.run_startup_timeout(run_id=d.run.id, now=LATER),
    "request_cancellation": lambda d, spare: services.run_request_cancellation(run_id=d.run.id, now=LATER),
    "skip": lambda d, spare: services.deployment_skip(deployment_id=d.run.deployment_id, now=LATER),
}


def _world() -> dict[str, Any]:
    """Everything a refused transition must leave alone."""
    return {
        "runs": sorted(Run.objects.values_list("id", "status", "updated_at", "first_pending_at")),
        "deployments": sorted(Deployment.objects.values_list("id", "status", "updated_at")),
        "runners": sorted(Runner.objects.values_list("id", "status", "accepted_at")),
        "events": event_count(),
    }


def _expected_refusal(op: str, status: str) -> tuple[type[Conflict], str]:
    if op == "accept":
        benign = status in (RunStatus.DISCARDED, RunStatus.CANCELLED)
        return Conflict, "run_already_terminal" if benign else "conflict"
    if op == "skip":
        return Conflict, "not_skippable"
    return RunTerminal, "run_terminal"


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("recipe", TERMINAL_RECIPES)
def test_it_never_changes_a_terminal_run(stack: Stack, group: RunnerGroup, recipe: str, op: str) -> None:
    d = drive(stack, group, recipe, now=at(0))
    status = expected_status(recipe)
    assert d.run.status == status
    # Something queued behind it, so a wrongful promotion would show.
    holder = drive(stack, group, "running", now=at(100))
    deploy(stack, now=at(200))
    spare = new_runner(group)
    before, token_before, world = row(d.run), token_row(d.run), _world()
    error, code = _expected_refusal(op, status)

    with pytest.raises(error) as exc:
        OPS[op](d, spare)

    assert exc.value.code == code
    assert exc.value.http_status == 409
    assert row(d.run) == before
    assert token_row(d.run) == token_before
    assert _world() == world
    assert Run.objects.get(id=holder.run.id).status == RunStatus.RUNNING


# (state, op) pairs where the run is live but not in a state the transition starts from.
WRONG_STATE: list[tuple[str, str]] = [
    ("queued", "assign"),
    ("queued", "reset_lease"),
    ("queued", "acknowledge_cancel"),
    ("queued", "finish_succeeded"),
    ("queued", "fail"),
    ("queued", "startup_timeout"),
    ("pending", "reset_lease"),
    ("pending", "acknowledge_cancel"),
    ("pending", "finish_succeeded"),
    ("pending", "finish_failure"),
    ("pending", "finish_cancelled"),
    ("assigned", "assign"),
    ("assigned", "acknowledge_cancel"),
    ("assigned", "finish_succeeded"),
    ("assigned", "finish_cancelled"),
    ("running", "assign"),
    ("running", "reset_lease"),
    ("running", "acknowledge_cancel"),
    ("running", "finish_cancelled"),
    ("running", "startup_timeout"),
    ("requested_cancellation", "assign"),
    ("requested_cancellation", "reset_lease"),
    ("requested_cancellation", "startup_timeout"),
    ("cancelling", "assign"),
    ("cancelling", "acknowledge_cancel"),
    ("cancelling", "startup_timeout"),
]


@pytest.mark.parametrize(("state", "op"), WRONG_STATE)
def test_it_refuses_a_transition_from_the_wrong_state(stack: Stack, group: RunnerGroup, state: str, op: str) -> None:
    if state == "queued":
        drive(stack, group, "running", now=at(0))
        d = Driven(run=deploy(stack, now=at(10)))
    else:
        d = drive(stack, group, state, now=at(0))
    assert d.run.status == state
    spare = new_runner(group)
    before, world = row(d.run), _world()

    with pytest.raises(InvalidTransition) as exc:
        OPS[op](d, spare)

    assert exc.value.code == "invalid_transition"
    assert exc.value.http_status == 409
    assert exc.value.extra["status"] == state
    assert state in exc.value.detail
    assert row(d.run) == before
    assert _world() == world


def test_it_refuses_to_reset_an_unexpired_lease_and_says_why(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned", now=at(0))
    assert d.run.assigned_expires_at is not None
    before, world = row(d.run), _world()

    with pytest.raises(InvalidTransition) as exc:
        services.run_reset_lease(run_id=d.run.id, now=d.run.assigned_expires_at - timedelta(seconds=1))

    assert exc.value.code == "invalid_transition"
    # The run is in the right state: the refusal must name the guard that failed, not the state.
    assert "lease" in exc.value.detail
    assert row(d.run) == before
    assert _world() == world
