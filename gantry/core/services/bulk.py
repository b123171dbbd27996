"""Run edges for a batch of runs, one statement per batch (docs/reapers.md, "How a sweep works").

The reapers move thousands of due rows per tick; the edge's statement for a
batch (gantry.sql.runs.move_batch) moves them all at once, with the same
guards and effects as for one run: rows that no longer pass a guard, or that
another transaction holds (a second sweep, a request), are left out rather
than overwritten or waited on. A batch that ends lane holders locks their
stacks first, in id order, in the same round trip. The finished-run metrics
go after commit, in one Redis pipeline per batch.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction

from gantry import metrics
from gantry.sql import runs as sql
from gantry.sql.statement import run_script


@dataclass(frozen=True)
class Moved:
    """One run a batch moved."""

    id: uuid.UUID
    stack_id: int
    organization_id: int
    first_pending_at: datetime | None
    status: str


def move_batch(edge: sql.Move, ids: Sequence[uuid.UUID], *, now: datetime, **args: Any) -> list[Moved]:
    """Take ``edge`` for every run of ``ids`` that passes its guards and is not held elsewhere; the runs moved.

    ``args`` go to :func:`gantry.sql.runs.batch_args` (per-run ``runners`` and ``reasons``, the edge's own).
    """
    if not ids:
        return []
    with transaction.atomic():
        rows = run_script(sql.batch_script(edge, sql.batch_args(ids, now=now, **args)))[-1]
        moved = [Moved(*row) for row in rows]
        if edge.terminal:
            transaction.on_commit(partial(record_finished, moved, now=now))
    return moved


def record_finished(moved: Iterable[Moved], *, now: datetime) -> None:
    """The finished-run metrics of a committed batch (``transitions.record_finished``), one Redis pipeline."""
    metrics.record_runs(
        (
            m.organization_id,
            {} if m.first_pending_at is None else {"pending_to_finished": (now - m.first_pending_at).total_seconds()},
            m.status,
        )
        for m in moved
    )


def reset_leases(ids: Sequence[uuid.UUID], *, now: datetime) -> list[Moved]:
    """assigned → pending once the lease lapsed; the lease is cleared, the runner pointer kept. No lane change."""
    return move_batch(sql.RESET_LEASE, ids, now=now)


def startup_timeouts(ids: Sequence[uuid.UUID], *, now: datetime, deadline: datetime | None = None) -> list[Moved]:
    """Never started (pending, or assigned with a lapsed lease) → startup_timeout; lanes promoted.

    ``deadline``, when given, adds "first pending before it" (the reaper's
    selection, judged again on the locked row).
    """
    return move_batch(sql.STARTUP_TIMEOUT, ids, now=now, deadline=deadline)


def cancel_backstops(ids: Sequence[uuid.UUID], *, now: datetime) -> list[Moved]:
    """requested_cancellation, never started, lease lapsed → cancelled; lanes promoted."""
    return move_batch(sql.CANCEL_BACKSTOP, ids, now=now, detail=json.dumps(sql.CANCEL_BACKSTOP_DETAIL))


def lose_runs(
    ids: Sequence[uuid.UUID], *, runners: Sequence[uuid.UUID], reasons: Sequence[str], now: datetime
) -> list[Moved]:
    """Executing runs of silent runners → failure (runner lost), each guarded on its runner still holding it."""
    return move_batch(sql.LOST, ids, now=now, runners=runners, reasons=reasons)
