"""Retention: finished runs past ``GANTRY_RETENTION_DAYS`` go, with their events, log chunks and live records;
finished webhook deliveries past it go too.

What is removed, and what is kept (docs/reapers.md, "Retention"):

- A run is removed once it is terminal, finished more than
  ``GANTRY_RETENTION_DAYS`` ago, and is **not** its deployment's newest
  attempt. With it go its run_events, its run token, its log chunks in
  storage (S3 or the local folder) and its Redis records (the live record and
  the reader's chunk index).
- Never removed: a run that is not terminal, and a deployment's newest run
  (so the deployment keeps its final status and its last run's record). The
  deployments themselves are kept. ``GANTRY_RETENTION_DAYS=0`` keeps
  everything for ever.
- A webhook delivery is removed once it is finished (delivered, or failed
  after its day of tries) more than ``GANTRY_RETENTION_DAYS`` ago, or with its
  run when the run is removed and the delivery is finished. A pending one is
  never removed: it still has an event to deliver.

Bounded per tick: the scan walks the partial index run_finished_idx
(migration 0014) in (finished_at, id) order, ``batch_size`` runs per
transaction and at most ``max_rows`` examined per tick, whether deleted or
kept. Kept runs (newest attempts) past the cut-off would otherwise be
re-read on every tick; a cursor in Redis remembers where the last tick
stopped, and the walk starts over from the oldest once it reaches the
cut-off, so a run superseded later (a retry of an old deployment) is found on
the next pass. A lost cursor only costs a walk from the start, still bounded.
Deliveries are bounded alike (``batch_size`` a statement, ``max_rows`` a
tick) and need no cursor: every row their scan selects is deleted.

Storage is deleted after the rows, through an outbox: each batch deletes the
runs and inserts their ids into ``log_purge`` in one transaction; after
commit the objects are deleted (S3 DeleteObjects, up to 1,000 keys a
request), then the Redis records, then the outbox rows. So no run row ever
names a chunk that is gone (the reader never shows a half-deleted log), and
a storage failure or a crash mid-way leaves outbox rows that every tick
retries first: no chunk is orphaned for ever. Deleting objects first would
instead leave visible runs with missing chunks whenever a delete failed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import redis
from django.db import connection, connections, transaction

from gantry import conf
from gantry.logs import live
from gantry.logs.reader import INDEX_KEY
from gantry.logs.storage import get_storage
from gantry.redis import client as redis_client
from gantry.sql import retention as sql

_T = TypeVar("_T")
Batch = Callable[[Callable[[], _T]], _T | None]

_BEFORE_ALL = (datetime(1, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


def _cursor_key() -> str:
    return f"gantry:retention:{connections['default'].settings_dict['NAME']}:cursor"


def _load_cursor() -> tuple[datetime, uuid.UUID]:
    try:
        raw = redis_client().get(_cursor_key())
    except (redis.RedisError, OSError):
        return _BEFORE_ALL
    if not isinstance(raw, bytes):
        return _BEFORE_ALL
    try:
        key, _, run_id = raw.decode().partition("|")
        return datetime.fromisoformat(key), uuid.UUID(run_id)
    except ValueError:
        return _BEFORE_ALL


def _save_cursor(after: tuple[datetime, uuid.UUID] | None) -> None:
    try:
        if after is None:
            redis_client().delete(_cursor_key())
        else:
            redis_client().set(_cursor_key(), f"{after[0].isoformat()}|{after[1]}", ex=7 * 24 * 3600)
    except (redis.RedisError, OSError):
        pass  # best-effort: the next tick walks from the oldest


def sweep(
    counts: Counter[str],
    batch: Batch[Any],
    *,
    now: datetime,
    batch_size: int | None = None,
    max_rows: int | None = None,
) -> None:
    """One tick: purge what earlier ticks left, then delete the next runs past retention (``reapers.retention``)."""
    cfg = conf.get()
    batch_size = batch_size or cfg.retention_batch_size
    max_rows = max_rows or cfg.retention_max_rows
    purge_pending(counts, batch, batch_size=batch_size, max_rows=max_rows)
    if cfg.retention_days == 0:
        return  # keep for ever
    cutoff = now - timedelta(days=cfg.retention_days)
    after, examined = _load_cursor(), 0
    while examined < max_rows:
        limit = min(batch_size, max_rows - examined)
        with connection.cursor() as cur:
            cur.execute(sql.SCAN, {"cutoff": cutoff, "after_key": after[0], "after_id": after[1], "limit": limit})
            rows = cur.fetchall()
        examined += len(rows)
        if rows:
            ids = [row_id for _, row_id in rows]
            if batch(partial(_delete, ids, counts, cutoff=cutoff, now=now)) is None:
                break  # an error: the cursor stays, the next tick retries this batch
            after = rows[-1]
        if len(rows) < limit:
            after = _BEFORE_ALL  # reached the cut-off: the next pass starts from the oldest
            break
    _save_cursor(None if after == _BEFORE_ALL else after)
    sweep_deliveries(counts, batch, cutoff=cutoff, batch_size=batch_size, max_rows=max_rows)


def sweep_deliveries(
    counts: Counter[str], batch: Batch[Any], *, cutoff: datetime, batch_size: int, max_rows: int
) -> None:
    """Delete webhook deliveries finished before ``cutoff``, oldest first.

    ``batch_size`` a transaction, ``max_rows`` a tick; a failed batch counts
    ``error`` and leaves the rest to the next tick.
    """
    deleted = 0
    while deleted < max_rows:
        limit = min(batch_size, max_rows - deleted)
        got = batch(partial(_delete_deliveries, cutoff, limit))
        if got is None:
            return  # an error: the next tick retries
        counts["delivery_deleted"] += got
        deleted += got
        if got < limit:
            return  # none left past the cut-off (or the rest are locked: the next tick)


def _delete_deliveries(cutoff: datetime, limit: int) -> int:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.DELETE_DELIVERIES, {"cutoff": cutoff, "limit": limit})
        return cur.rowcount


def _delete(ids: list[uuid.UUID], counts: Counter[str], *, cutoff: datetime, now: datetime) -> bool:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.DELETE, {"ids": ids, "cutoff": cutoff, "now": now})
        runs, events, deliveries = cur.fetchone()
    counts["run_deleted"] += runs
    counts["event_deleted"] += events
    counts["delivery_deleted"] += deliveries
    # After commit: the objects of what this batch deleted (and anything left before it).
    if runs:
        purge_pending(counts, lambda work: work(), batch_size=len(ids), max_rows=len(ids))
    return True


def purge_pending(counts: Counter[str], batch: Batch[Any], *, batch_size: int, max_rows: int) -> None:
    """Delete the stored chunks and Redis records of runs in the outbox, oldest first, then their outbox rows.

    A run whose storage delete fails keeps its outbox row (``purge_failed``)
    and is retried on the next tick; the rest of the batch goes on.
    """
    done = 0
    while done < max_rows:
        with connection.cursor() as cur:
            cur.execute(sql.QUEUED_PURGES, [min(batch_size, max_rows - done)])
            ids = [row[0] for row in cur.fetchall()]
        if not ids:
            return
        outcome = batch(partial(_purge, ids))
        if outcome is None:
            return
        purged, failed = outcome
        counts["log_purged"] += purged
        counts["purge_failed"] += failed
        done += len(ids)
        if failed:
            return  # storage is failing: leave the rest for the next tick


def _purge(ids: list[uuid.UUID]) -> tuple[int, int]:
    failed = get_storage().delete_runs(ids)
    ok = [run_id for run_id in ids if run_id not in failed]
    # The live record expires on its own; the reader's chunk index would outlive the run for a week.
    live.delete_many(ok, *(INDEX_KEY.format(run_id=run_id) for run_id in ok))
    with connection.cursor() as cur:
        cur.execute(sql.DELETE_PURGES, [ok])
    return len(ok), len(failed)
