"""The stub reaper: delete never-accepted runner rows past the cutoff, a batch at a time.

It lives beside the reapers that run it (``reapers.inactive_runners``); its
statement is ``gantry.sql.reapers.DELETE_STUBS``, whose "still holds a run"
test it shares with deregister (``gantry.sql.runners.holds_run``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection

from gantry.sql import reapers as sql


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
        cur.execute(sql.DELETE_STUBS, params)
        rows = cur.fetchall()
    return StubBatch(
        deleted=[row[1] for row in rows if row[2]],
        examined=len(rows),
        last=(rows[-1][0], rows[-1][1]) if rows else None,
    )
