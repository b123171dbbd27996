"""Set-based run transitions: one batch of runs per statement (docs/reapers.md, "How a sweep works").

The reapers move thousands of due rows per tick; a dozen ORM statements per
row cost them 14-25 ms a row. Here one guarded ``UPDATE … FROM unnest(…) …
RETURNING`` moves a whole batch, and data-modifying CTEs of the same
statement write its events, revoke its tokens and bring its deployments
along. The reapers' three run transitions (lease reset, startup timeout,
cancellation backstop) and lane promotion are written here once: the per-row
services (``run_reset_lease``, ``run_startup_timeout``, ``run_cancel_backstop``,
``stack_promote_next``) call these with one run. The rules, as SQL:

- Guards: the ``WHERE`` holds the transition's guard (the expected states
  and the extra condition), evaluated on the row's latest version when it was
  locked, so a row that changed since the sweep selected it is simply not in
  ``RETURNING``: skipped, never overwritten. In a sweep, rows another
  transaction holds locked (a second sweep, a request) are skipped (``SKIP
  LOCKED``) rather than waited on; the next sweep sees them again if they are
  still due. One run (the per-row services) waits for its lock instead.
- Lanes: a batch that ends lane holders first locks their stacks ``FOR NO KEY
  UPDATE`` in id order (the services' order: stack, then run), and after the
  transition promotes each freed stack's oldest queued run in one statement,
  in the same transaction, so a run queued meanwhile is never left behind no
  holder. The partial unique index ``run_one_lane_holder_per_stack`` stays the
  last word.
- Deployments: a deployment follows its newest run (``sync_deployment``).
- NOTIFY needs no code: migration 0004's triggers fire per changed row and
  PostgreSQL sends one message per org per transaction on commit.

Side effects outside PostgreSQL (metrics) run after commit, in one pipeline
per batch (:func:`record_finished`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection, transaction

from gantry import metrics
from gantry.core.models import DEPLOYMENT_STATUS_FOR_RUN, LANE_HOLDERS, TERMINAL, RunStatus


def literals(states: Iterable[str]) -> str:
    """A status list as SQL literals, never parameters, so partial indexes match (see ``holds_run_sql``)."""
    return ", ".join(f"'{status}'" for status in sorted(states))


# The guard "no runner can still accept this run": a lease has lapsed when
# there is none (pending runs never carry one) or it is past expiry.
LEASE_LAPSED = "(run.assigned_expires_at IS NULL OR run.assigned_expires_at < %(now)s)"


def _sync_deployments(source: str) -> str:
    """A CTE body: deployments of the runs in ``source`` take their status, when the run is the newest attempt."""
    return f"""
    UPDATE deployment d SET status = {source}.deployment_status, updated_at = %(now)s
    FROM {source}
    WHERE d.id = {source}.deployment_id AND d.status <> {source}.deployment_status
      AND NOT EXISTS (SELECT 1 FROM run newer
                      WHERE newer.deployment_id = {source}.deployment_id AND newer.attempt > {source}.attempt)
    """


def _status_case(column: str) -> str:
    """SQL mapping a run status to its deployment status (``DEPLOYMENT_STATUS_FOR_RUN``)."""
    whens = " ".join(f"WHEN '{run}' THEN '{dep}'" for run, dep in sorted(DEPLOYMENT_STATUS_FOR_RUN.items()))
    return f"CASE {column} {whens} END"


@dataclass(frozen=True)
class Moved:
    """One run a batch transition moved."""

    id: uuid.UUID
    stack_id: int
    organization_id: int
    first_pending_at: datetime | None


def transition_batch(
    *,
    ids: Sequence[uuid.UUID],
    expected: Iterable[str],
    target: str,
    guard: str,
    event: str,
    now: datetime,
    detail: dict[str, Any] | None = None,
    reasons: Sequence[str | None] | None = None,
    runners: Sequence[uuid.UUID | None] | None = None,
    params: dict[str, Any] | None = None,
    skip_locked: bool = True,
) -> list[Moved]:
    """Move every run of ``ids`` still in ``expected`` and passing ``guard`` (SQL on ``run``) to ``target``.

    One statement: the guarded UPDATE, its run_events, and for a terminal
    target the token revocation and the per-row terminal fields
    (``finished_at``, lease cleared). ``reasons`` sets ``failure_reason`` per
    run (None keeps it); ``runners`` adds the guard "still bound to this
    runner" per run. A terminal target needs the caller to hold the stacks'
    locks (:func:`lock_stacks`) and to promote the lanes after
    (:func:`promote_lanes`), inside one transaction.
    """
    if not ids:
        return []
    terminal = target in TERMINAL
    sets = ["status = %(target)s", "updated_at = %(now)s", "assigned_at = NULL", "assigned_expires_at = NULL"]
    if terminal:
        sets.append("finished_at = %(now)s")
    if reasons is not None:
        sets.append("failure_reason = COALESCE(v.reason, run.failure_reason)")
    revoke = (
        ", revoked AS (UPDATE run_token SET revoked_at = %(now)s "
        "WHERE run_id IN (SELECT id FROM moved) AND revoked_at IS NULL)"
        if terminal
        else ""
    )
    sql = f"""
    WITH v AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(reasons)s::text[], %(runners)s::uuid[]) AS v(id, reason, runner)
    ),
    locked AS (
        -- Stack locks (when needed) are already held: run rows are locked second.
        SELECT run.id FROM run JOIN v ON v.id = run.id
        WHERE run.status IN ({literals(expected)}) AND (v.runner IS NULL OR run.assigned_runner_id = v.runner)
          AND {guard}
        FOR NO KEY UPDATE OF run{" SKIP LOCKED" if skip_locked else ""}
    ),
    moved AS (
        UPDATE run SET {", ".join(sets)}
        FROM v
        WHERE run.id = v.id AND run.id IN (SELECT id FROM locked)
          -- The guard again, on the locked row: what the selection saw may be stale.
          AND run.status IN ({literals(expected)}) AND (v.runner IS NULL OR run.assigned_runner_id = v.runner)
          AND {guard}
        RETURNING run.id, run.stack_id, run.organization_id, run.first_pending_at, run.deployment_id, run.attempt,
                  {_status_case("run.status")} AS deployment_status
    ),
    events AS (
        INSERT INTO run_event (run_id, at, kind, detail)
        SELECT id, %(now)s, %(event)s, %(detail)s::jsonb FROM moved
    ),
    deployments AS ({_sync_deployments("moved")}){revoke}
    SELECT id, stack_id, organization_id, first_pending_at FROM moved
    """
    n = len(ids)
    args = {
        **(params or {}),
        "ids": list(ids),
        "reasons": list(reasons) if reasons is not None else [None] * n,
        "runners": list(runners) if runners is not None else [None] * n,
        "target": target,
        "now": now,
        "event": event,
        "detail": json.dumps(detail or {}),
    }
    with connection.cursor() as cur:
        cur.execute(sql, args)
        return [Moved(*row) for row in cur.fetchall()]


def lock_stacks(run_ids: Sequence[uuid.UUID]) -> None:
    """Lock the stacks of these runs, in id order (``services.transitions.lock_stack`` for a batch)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id FROM stack WHERE id IN (SELECT stack_id FROM run WHERE id = ANY(%s::uuid[])) "
            "ORDER BY id FOR NO KEY UPDATE",
            [list(run_ids)],
        )


# PromoteNextOnStack for many stacks (``services.transitions.stack_promote_next``):
# each stack with no lane holder left has its oldest queued run made pending,
# with first_pending_at stamped the first time only and a "promoted" event.
_PROMOTE_SQL = f"""
WITH free AS (
    SELECT s.id FROM unnest(%(stacks)s::bigint[]) AS s(id)
    WHERE NOT EXISTS (SELECT 1 FROM run WHERE run.stack_id = s.id AND run.status IN ({literals(LANE_HOLDERS)}))
),
nxt AS (
    SELECT q.id FROM free CROSS JOIN LATERAL (
        SELECT run.id FROM run WHERE run.stack_id = free.id AND run.status = '{RunStatus.QUEUED}'
        ORDER BY run.created_at, run.id LIMIT 1
    ) q
),
moved AS (
    UPDATE run SET status = '{RunStatus.PENDING}', updated_at = %(now)s,
                   first_pending_at = COALESCE(run.first_pending_at, %(now)s)
    FROM nxt WHERE run.id = nxt.id AND run.status = '{RunStatus.QUEUED}'
    RETURNING run.id, run.deployment_id, run.attempt, {_status_case("run.status")} AS deployment_status
),
events AS (
    INSERT INTO run_event (run_id, at, kind, detail) SELECT id, %(now)s, 'promoted', '{{}}'::jsonb FROM moved
),
deployments AS ({_sync_deployments("moved")})
SELECT id FROM moved
"""


def promote_lanes(stack_ids: Iterable[int], *, now: datetime) -> list[uuid.UUID]:
    """Promote the next queued run of each freed stack; the caller holds the stacks' locks. Answers the runs."""
    stacks = sorted(set(stack_ids))
    if not stacks:
        return []
    with connection.cursor() as cur:
        cur.execute(_PROMOTE_SQL, {"stacks": stacks, "now": now})
        return [row[0] for row in cur.fetchall()]


def record_finished(moved: Iterable[Moved], *, status: str, now: datetime) -> None:
    """The finished-run metrics of a committed batch (``transitions._record_finished``), one Redis pipeline."""
    metrics.record_runs(
        (
            m.organization_id,
            {} if m.first_pending_at is None else {"pending_to_finished": (now - m.first_pending_at).total_seconds()},
            status,
        )
        for m in moved
    )


def terminate_batch(ids: Sequence[uuid.UUID], *, target: str, now: datetime, **kw: Any) -> list[Moved]:
    """End a batch of lane holders in one transaction: stacks locked, runs moved, freed lanes promoted.

    ``services.transitions.terminate`` for many runs; ``kw`` goes to :func:`transition_batch`.
    """
    with transaction.atomic():
        lock_stacks(ids)
        moved = transition_batch(ids=ids, target=target, now=now, **kw)
        promote_lanes((m.stack_id for m in moved), now=now)
        transaction.on_commit(partial(record_finished, moved, status=target, now=now))
    return moved


# The reapers' run transitions. Each guard is the one place its rule is
# written; ``guard`` (in words) is what a one-run refusal says.
RESET_LEASE_GUARD = "its assignment lease to have lapsed"
NEVER_STARTED_GUARD = "a never-started run whose assignment lease has lapsed"
STARTUP_TIMEOUT_REASON = "no runner started the run before the startup deadline"
CANCEL_BACKSTOP_DETAIL = {"reason": "cancellation was requested before the run started; no runner will acknowledge it"}


def reset_leases(ids: Sequence[uuid.UUID], *, now: datetime, skip_locked: bool = True) -> list[Moved]:
    """assigned → pending once the lease lapsed; the lease is cleared, the runner pointer kept. No lane change."""
    with transaction.atomic():
        return transition_batch(
            ids=ids,
            expected={RunStatus.ASSIGNED},
            target=RunStatus.PENDING,
            guard="run.assigned_expires_at < %(now)s",
            event="lease_expired",
            now=now,
            skip_locked=skip_locked,
        )


def startup_timeouts(
    ids: Sequence[uuid.UUID], *, now: datetime, deadline: datetime | None = None, skip_locked: bool = True
) -> list[Moved]:
    """Never started (pending, or assigned with a lapsed lease) → startup_timeout; lanes promoted.

    ``deadline``, when given, adds "first pending before it" (the reaper's
    selection, re-checked on the locked row).
    """
    guard = f"run.started_at IS NULL AND {LEASE_LAPSED}"
    if deadline is not None:
        guard += " AND run.first_pending_at < %(deadline)s"
    return terminate_batch(
        ids,
        expected={RunStatus.PENDING, RunStatus.ASSIGNED},
        target=RunStatus.STARTUP_TIMEOUT,
        guard=guard,
        event="startup_timeout",
        reasons=[STARTUP_TIMEOUT_REASON] * len(ids),
        params={"deadline": deadline},
        now=now,
        skip_locked=skip_locked,
    )


def cancel_backstops(ids: Sequence[uuid.UUID], *, now: datetime, skip_locked: bool = True) -> list[Moved]:
    """requested_cancellation, never started, lease lapsed → cancelled; lanes promoted."""
    return terminate_batch(
        ids,
        expected={RunStatus.REQUESTED_CANCELLATION},
        target=RunStatus.CANCELLED,
        guard=f"run.started_at IS NULL AND {LEASE_LAPSED}",
        event="cancel_backstop",
        detail=CANCEL_BACKSTOP_DETAIL,
        now=now,
        skip_locked=skip_locked,
    )
