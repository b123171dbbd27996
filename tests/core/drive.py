"""Helpers that drive runs through the state machine (docs/design.md §3) with explicit times.

Every helper goes through ``gantry.core.services`` only; the tests that bypass the
services on purpose (database invariants) write their SQL themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gantry import conf
from gantry.core import services
from gantry.core.models import Deployment, Run, RunEvent, Runner, RunnerGroup, RunStatus, RunToken, Stack

# A fixed origin: every test states its times relative to it.
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float = 0, *, minutes: float = 0) -> datetime:
    return T0 + timedelta(seconds=seconds, minutes=minutes)


def lease() -> timedelta:
    return timedelta(seconds=conf.get().assignment_ttl)


def deploy(stack: Stack, *, now: datetime, spec: dict[str, Any] | None = None) -> Run:
    """Queue a deployment on ``stack`` and answer its (only) run."""
    deployment = services.deployment_create(stack=stack, spec=spec, now=now)
    return Run.objects.get(deployment=deployment)


def newest_run(deployment_id: int) -> Run:
    return Run.objects.filter(deployment_id=deployment_id).order_by("-attempt").first()  # type: ignore[return-value]


def new_runner(group: RunnerGroup) -> Runner:
    """A not_ready stub, as the poll creates it."""
    return Runner.objects.create(runner_group=group)


def reload(run: Run) -> Run:
    return Run.objects.get(id=run.id)


def deployment_status(run: Run) -> str:
    return Deployment.objects.values_list("status", flat=True).get(id=run.deployment_id)


def event_kinds(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run.id).order_by("at", "id").values_list("kind", flat=True))


def event_count() -> int:
    return RunEvent.objects.count()


def row(run: Run) -> dict[str, Any]:
    """Every column of the run, for "nothing changed" assertions."""
    return Run.objects.filter(id=run.id).values().get()


def token_row(run: Run) -> dict[str, Any] | None:
    return RunToken.objects.filter(run_id=run.id).values().first()


@dataclass
class Driven:
    """A run driven to some state, with the runner bound to it (if any) and its API token (if accepted)."""

    run: Run
    runner: Runner | None = None
    api_token: str | None = None
    # The time of the last step taken, so callers can go on from there.
    now: datetime = T0


# The path from a fresh pending run to each state, one service call per step.
_PATHS: dict[str, list[str]] = {
    "pending": [],
    "assigned": ["assign"],
    "running": ["assign", "accept"],
    "requested_cancellation": ["assign", "accept", "request_cancel"],
    "cancelling": ["assign", "accept", "request_cancel", "ack"],
    "succeeded": ["assign", "accept", "finish_succeeded"],
    "failure": ["assign", "accept", "finish_failure"],
    "failure_by_fail": ["assign", "accept", "fail"],
    "cancelled": ["assign", "accept", "request_cancel", "ack", "finish_cancelled"],
    "cancelled_before_start": ["assign", "request_cancel"],
    "discarded": ["assign", "skip"],
    "startup_timeout": ["assign", "startup_timeout"],
}

# One recipe per way a run can end (several per terminal status).
TERMINAL_RECIPES = [
    "succeeded",
    "failure",
    "failure_by_fail",
    "cancelled",
    "cancelled_before_start",
    "discarded",
    "startup_timeout",
]


def drive(stack: Stack, group: RunnerGroup, state: str, *, now: datetime = T0) -> Driven:
    """Create a deployment on a free ``stack`` and take its run to ``state`` (a key of ``_PATHS``).

    Each step happens one second after the previous one.
    """
    run = deploy(stack, now=now)
    assert run.status == RunStatus.PENDING, "drive() needs a free lane"
    return advance(Driven(run=run, now=now), group, _PATHS[state])


def advance(d: Driven, group: RunnerGroup, steps: list[str]) -> Driven:
    for step in steps:
        d.now += timedelta(seconds=1)
        run_id = d.run.id
        if step == "assign":
            d.runner = new_runner(group)
            services.run_assign(run_id=run_id, runner=d.runner, now=d.now)
        elif step == "accept":
            assert d.runner is not None
            _, d.api_token = services.run_accept(run_id=run_id, runner_id=d.runner.id, now=d.now)
        elif step == "request_cancel":
            services.run_request_cancellation(run_id=run_id, now=d.now)
        elif step == "ack":
            services.run_acknowledge_cancel(run_id=run_id, now=d.now)
        elif step == "finish_succeeded":
            services.run_finish(run_id=run_id, outcome="succeeded", exit_code=0, now=d.now)
        elif step == "finish_failure":
            services.run_finish(run_id=run_id, outcome="failure", exit_code=2, error="step failed", now=d.now)
        elif step == "finish_cancelled":
            services.run_finish(run_id=run_id, outcome="cancelled", exit_code=143, now=d.now)
        elif step == "fail":
            services.run_fail(run_id=run_id, reason="runner lost", now=d.now)
        elif step == "skip":
            services.deployment_skip(deployment_id=d.run.deployment_id, now=d.now)
        elif step == "startup_timeout":
            # An assigned run times out only once its lease has lapsed (no runner can still accept it).
            expires = d.run.assigned_expires_at
            if d.run.status == RunStatus.ASSIGNED and expires is not None and expires >= d.now:
                d.now = expires + timedelta(seconds=1)
            services.run_startup_timeout(run_id=run_id, now=d.now)
        else:  # pragma: no cover - a typo in a path
            raise AssertionError(f"unknown step {step}")
        d.run = reload(d.run)
    return d


def expected_status(recipe: str) -> str:
    """The run status a ``_PATHS`` key ends in."""
    return {
        "failure_by_fail": RunStatus.FAILURE,
        "cancelled_before_start": RunStatus.CANCELLED,
    }.get(recipe, recipe)
