"""The stub reaper's one statement: delete never-accepted runner rows past the cutoff, a batch at a time.

It lives beside the reapers that run it (``reapers.inactive_runners``); the
"still holds a run" test it shares with deregister is
``gantry.sql.runners.holds_run``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection

from gantry.sql.runners import holds_run

# The stub reaper's statement, one batch at a time. A stub (never accepted)
# past the cutoff can no longer accept: its claim's lease started when the
# stub was created, and GANTRY_STUB_CUTOFF is longer than the lease
# (conf.check). Its "NOT holds a run" is deregister's own test, so a
# stub is kept whatever the settings while it could still accept, or while a
# never-started run stuck in requested_cancellation points at it (the
# cancellation backstop frees that run first). The ON DELETE SET NULL foreign
# key releases each deleted stub's run for dispatch, and the runner trigger
# NOTIFYs its org (migration 0004).
#
# The candidates are taken first, oldest first, straight off
# runner_stub_created_idx, and only then tested: written as one filtered
# SELECT … LIMIT, the planner reads every due stub (or every runner) to sort
# them before the LIMIT, so a sweep would cost its due stubs squared. The
# answer lists every candidate, deleted or kept, so the caller pages on by
# (created_at, id) past kept ones.
DELETE_STUBS_SQL = """
WITH candidate AS MATERIALIZED (
    SELECT id, created_at FROM runner
    WHERE status IN ('not_ready', 'ready') AND accepted_at IS NULL AND created_at < %(created_before)s
      AND (created_at, id) > (%(after_key)s, %(after_id)s)
    ORDER BY created_at, id
    LIMIT %(limit)s
    -- A stub some request is changing right now (ready, deregister) is left
    -- for the next sweep rather than waited on.
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM runner r USING candidate c
    WHERE r.id = c.id AND NOT {holds_run}
    RETURNING r.id
)
SELECT c.created_at, c.id, d.id IS NOT NULL FROM candidate c LEFT JOIN deleted d ON d.id = c.id
ORDER BY c.created_at, c.id
""".format(holds_run=holds_run("r.id"))


class StubBatch(NamedTuple):
    deleted: list[uuid.UUID]
    # How many stubs the batch examined, and the (created_at, id) of the last: where the next batch starts.
    examined: int
    last: tuple[datetime, uuid.UUID] | None


def runner_delete_stubs(
    *, created_before: datetime, now: datetime, limit: int, after: tuple[datetime, uuid.UUID]
) -> StubBatch:
    """DeleteInactive for stubs: delete never-accepted runners created before ``created_before``.

    One batch: up to ``limit`` stubs, oldest first, after the (created_at, id)
    ``after``. Stubs are not_ready, or ready and never accepted; neither
    heartbeats, so they age from ``created_at``.
    """
    params: dict[str, Any] = {
        "created_before": created_before,
        "now": now,
        "limit": limit,
        "after_key": after[0],
        "after_id": after[1],
    }
    with connection.cursor() as cur:
        cur.execute(DELETE_STUBS_SQL, params)
        rows = cur.fetchall()
    return StubBatch(
        deleted=[row[1] for row in rows if row[2]],
        examined=len(rows),
        last=(rows[-1][0], rows[-1][1]) if rows else None,
    )
