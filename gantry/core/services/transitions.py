"""How the services move a run, and how a refusal is explained (docs/design.md, "The run state machine").

An edge is a :class:`gantry.sql.runs.Move`: one guarded statement whose
effects (the event, the deployment, the token, the lane) are defined once in
gantry/sql/runs.py, for one run and for a batch alike. Here:

- :func:`move_plan` runs a Move for one run (as a plan, gantry.sql.statement,
  for either driver) and answers an :class:`Outcome`: the moved run, or the
  row state the statement judged and refused;
- :func:`refusal` turns that state into the contract's error, so a guard is
  written once (as SQL) and its refusal derived from the same snapshot;
- :func:`move` is both for a sync caller: the moved run, or the error.

Lanes: a terminal edge locks its stack first (always stack, then run) in the
same round trip, so a run queued while the lane holder finishes can never be
left queued behind no holder; the partial unique index
``run_one_lane_holder_per_stack`` remains the last word.

These are the service modules' own tools, not part of ``services``' public face.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection
from django.utils import timezone

from gantry import metrics
from gantry.core.errors import InvalidTransition, NotFound, RunTerminal
from gantry.core.models import LANE_HOLDERS, TERMINAL, Deployment, Run, RunSelector, RunStatus, Stack
from gantry.sql import claim as claim_sql
from gantry.sql import runs as sql
from gantry.sql.rows import instance
from gantry.sql.statement import AfterCommit, Plan, drive, fetchone

NOTIFY_CHANNEL = claim_sql.NOTIFY_CHANNEL


def resolve_now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def notify_claimable(*, organization_id: int) -> None:
    """Tell parked long polls of this org that a claim may now succeed.

    A *run* becoming claimable notifies by itself (triggers on run and runner,
    migration 0004); this is for the other changes that can make a claim
    succeed: a group undrained or relabelled, a new default group, a new rate.
    NOTIFY is transactional: it is delivered on commit and dropped on rollback,
    so a listener never wakes for a run it cannot see yet.
    """
    with connection.cursor() as cur:
        cur.execute(claim_sql.NOTIFY, [NOTIFY_CHANNEL, str(organization_id)])


def lock_stack(stack_id: int) -> None:
    """Lock the stack's lane (``FOR NO KEY UPDATE``) for the caller's transaction."""
    if fetchone(sql.LOCK_STACK_BY_ID, {"stack": stack_id}) is None:
        raise NotFound("stack not found")


@dataclass(frozen=True, slots=True)
class State:
    """The row a one-run statement judged, as it was before any change; ``status`` None: there is no such run."""

    refused: str | None
    status: str | None
    assigned_runner_id: uuid.UUID | None
    assigned_expires_at: datetime | None
    started_at: datetime | None
    exit_code: int | None
    log_manifest: Any


@dataclass(frozen=True, slots=True)
class Outcome:
    """A one-run statement's answer: the moved run (None: refused), the state judged, the Move's extra columns."""

    run: Run | None
    state: State
    also: tuple[Any, ...] = ()


def move_plan(move: sql.Move, args: dict[str, Any]) -> Plan[Outcome]:
    """Take ``move`` for one run (``args``: :func:`gantry.sql.runs.one_args`); a terminal edge's metrics on commit."""
    rows = yield sql.one_script(move, args)
    row = rows[-1][0]
    state = State(*row[: sql.STATE_WIDTH])
    if isinstance(state.log_manifest, str):  # a JSON column arrives as text (gantry.sql.rows)
        state = _replace_manifest(state, json.loads(state.log_manifest))
    moved = None
    if row[sql.STATE_WIDTH] is not None:
        moved = instance(Run, row, sql.STATE_WIDTH)
        if move.terminal:
            yield AfterCommit(partial(record_finished, moved))
    return Outcome(moved, state, tuple(row[sql.STATE_WIDTH + sql.RUN_WIDTH :]))


def _replace_manifest(state: State, manifest: Any) -> State:
    return State(
        state.refused,
        state.status,
        state.assigned_runner_id,
        state.assigned_expires_at,
        state.started_at,
        state.exit_code,
        manifest,
    )


def refusal(move: sql.Move, state: State, *, target: str | None = None, expected: Iterable[str] = ()) -> Exception:
    """The error for a refused one-run move, from the state the statement judged.

    ``target`` and ``expected`` name the edge as its caller took it (an edge
    whose target or expected states are a parameter); by default the Move's own.
    """
    current = state.status
    if current is None:
        return NotFound("run not found")
    if current in TERMINAL:
        return RunTerminal(f"run is {current}; a finished run never changes", status=current)
    target = target or next(iter(sorted(move.targets)))
    guard = next((g for g in move.guards if g.name == state.refused), None)
    if guard is not None:
        # Right state, but one of the edge's conditions failed: name it.
        return InvalidTransition(f"run is {current}, but {target} needs {guard.words}", status=current)
    wanted = ", ".join(sorted(expected or move.expected))
    return InvalidTransition(f"run is {current}; {target} needs it to be one of: {wanted}", status=current)


def move(
    edge: sql.Move, *, run_id: uuid.UUID, now: datetime, expected: frozenset[str] | None = None, **args: Any
) -> Run:
    """Take ``edge`` for one run: the moved run, or the error its refusal means.

    ``expected`` narrows the states an edge with a parameter of them may leave.
    """
    if edge.expected_param:
        args["expected"] = sorted(expected if expected is not None else edge.expected)
    outcome = drive(move_plan(edge, sql.one_args(run=run_id, now=now, **args)))
    if outcome.run is None:
        raise refusal(edge, outcome.state, expected=expected or ())
    return outcome.run


def detail_json(detail: Mapping[str, Any] | None) -> str:
    return json.dumps(dict(detail or {}))


def selector_id_for(*, organization_id: int, selector: dict[str, Any]) -> int:
    """The id of this org's row for ``selector``, created on first use."""
    existing = RunSelector.objects.filter(organization_id=organization_id, selector=selector).first()
    if existing is not None:
        return existing.id
    with connection.cursor() as cur:
        cur.execute(sql.SELECTOR_UPSERT, [organization_id, json.dumps(selector, sort_keys=True)])
    return RunSelector.objects.get(organization_id=organization_id, selector=selector).id


def run_create_on_lane(
    *,
    deployment: Deployment,
    stack: Stack,
    attempt: int,
    now: datetime,
    priority: int,
    detail: dict[str, Any] | None = None,
) -> Run:
    """Create a run on the stack's lane (the caller holds the stack lock): pending when the lane is free, else queued.

    ``detail`` adds to the one ``created`` event (a retry names the attempt it repeats).
    """
    lane_taken = Run.objects.filter(stack_id=stack.id, status__in=sorted(LANE_HOLDERS)).exists()
    selector = stack.runner_selector
    run = Run.objects.create(
        organization_id=stack.organization_id,
        stack=stack,
        deployment=deployment,
        attempt=attempt,
        priority=priority,
        status=RunStatus.QUEUED if lane_taken else RunStatus.PENDING,
        runner_selector=selector,
        selector_id=selector_id_for(organization_id=stack.organization_id, selector=selector),
        first_pending_at=None if lane_taken else now,
        created_at=now,
        updated_at=now,
    )
    fetchone(sql.CREATED, {"run": run.id, "now": now, "detail": detail_json(detail)})
    return run


def record_finished(run: Run) -> None:
    """Count a finished run in the metrics; called on commit (a rolled-back transition is never counted)."""
    timings = {}
    if run.first_pending_at is not None and run.finished_at is not None:  # a run skipped while queued never pended
        timings["pending_to_finished"] = (run.finished_at - run.first_pending_at).total_seconds()
    metrics.record_run(organization_id=run.organization_id, timings=timings, finished=run.status)
