"""The writes of the logs app: live pushes, chunk uploads, and the reaper's flush (docs/logs.md).

Storage calls (S3 round trips) are made outside any transaction; the only
database writes are one guarded UPDATE of ``run.log_manifest``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
from django.db import DatabaseError, connection

from gantry.core.errors import ChunkExists, Conflict, InvalidRequest, NotFound, RunTerminal
from gantry.core.manifest import is_sha256
from gantry.core.models import TERMINAL, Run
from gantry.logs import live
from gantry.logs.limits import CHUNK_GZIP_MAX, MAX_CHUNKS
from gantry.logs.reader import ChunkIndex, gunzip
from gantry.logs.storage import LocalStorage, LogStorage, PresignedPut, UploadGrant, encode_times, get_storage
from gantry.sql import logs as sql
from gantry.sql.statement import fetchone

log = logging.getLogger("gantry.logs")

# Storage writes a batch flush runs at once (see flush_live_logs).
FLUSH_THREADS = 16


def _held(run_id: uuid.UUID, runner_id: uuid.UUID, runner_group_id: int | None = None) -> bool:
    """The runner (of ``runner_group_id``, when given) is executing the run (accepted, not finished)."""
    row = fetchone(sql.HELD, {"run": run_id, "runner": runner_id, "grp": runner_group_id})
    return bool(row and row[0])


def live_push(
    *, run_id: uuid.UUID, runner_id: uuid.UUID, chunk_index: int, sealed_chunks: int, data: bytes,
    times: list[list[int]] | None = None,
) -> bool:  # fmt: skip
    """Replace the run's live record; False when the push was dropped.

    A push for a run its runner no longer executes (finished, failed by a
    reaper, reassigned) is dropped: the runner's last tick can land after
    /done deleted the record, and storing it would resurrect a stale record
    for a run whose log storage is already authoritative. The check and the
    SET are not atomic, so that can still happen in a narrow window; it is
    harmless, because the reader ignores the live record once the run has a
    manifest, and the record expires.
    """
    if not _held(run_id, runner_id):
        log.info(
            "live log push dropped: run %s is not executing on runner %s",
            run_id,
            runner_id,
            extra={"event": "logs.live_dropped", "run_id": str(run_id)},
        )
        return False
    return _store_live(run_id, chunk_index=chunk_index, sealed_chunks=sealed_chunks, data=data, times=times)


def _store_live(
    run_id: uuid.UUID, *, chunk_index: int, sealed_chunks: int, data: bytes, times: list[list[int]] | None
) -> bool:
    """Store a push (both paths: the view's and the fast lane's) and stamp ``run.first_output_at`` on the run's
    first push with output; False when Redis dropped it.

    The Redis marker set NX in the push's own pipeline (live.FIRST_KEY)
    decides, so the database sees one write per run, not one per push. A
    failed write gives the marker back: the next push with output tries again.
    """
    result = live.store(run_id, chunk_index=chunk_index, sealed_chunks=sealed_chunks, data=data, times=times)
    if result.first_output:
        try:
            with connection.cursor() as cur:
                cur.execute(sql.STAMP_FIRST_OUTPUT, {"run": run_id})
        except DatabaseError:
            log.warning("run %s: first_output_at not stamped", run_id, exc_info=True,
                        extra={"event": "logs.first_output_failed", "run_id": str(run_id)})  # fmt: skip
            live.forget_first(run_id)
    return result.stored


def live_push_hot(
    *, run_id: uuid.UUID, runner_id: uuid.UUID, runner_group_id: int | None, chunk_index: int,
    sealed_chunks: int, data: bytes, times: list[list[int]] | None = None,
) -> bool:  # fmt: skip
    """The push's common case (gantry.server.lane): True once the runner executes the run and the push is handled.

    Handled is stored, or dropped because Redis is unavailable (the route's
    204 either way). False wrote nothing: the run is not executing on this
    runner of ``runner_group_id``, and :func:`live_push` behind the view's
    authentication says whether that is a drop or a refusal.
    """
    if not _held(run_id, runner_id, runner_group_id):
        return False
    _store_live(run_id, chunk_index=chunk_index, sealed_chunks=sealed_chunks, data=data, times=times)
    return True


def chunk_upload_url(
    *, run_id: uuid.UUID, runner_id: uuid.UUID, n: int, sha256: str, size: int, times: list[list[int]] | None = None
) -> PresignedPut:
    """A presigned PUT for sealed chunk ``n``, only while the runner executes the run.

    ``times`` (the chunk's time marks) are stored beside the chunk now, write-once
    like the chunk (a retried handout sends the same marks): the chunk's own
    bytes stay exactly the log, and a runner that sends no times changes nothing.
    """
    if not 0 <= n < MAX_CHUNKS:
        raise InvalidRequest(f"chunk number must be from 0 to {MAX_CHUNKS - 1}")
    if not is_sha256(sha256):
        raise InvalidRequest("sha256 must be the hex sha256 of the gzip bytes (64 characters)")
    if not 1 <= size <= CHUNK_GZIP_MAX:
        raise InvalidRequest(f"size must be from 1 to {CHUNK_GZIP_MAX} bytes")
    if not _held(run_id, runner_id):
        status = Run.objects.filter(id=run_id).values_list("status", flat=True).first()
        if status is None:
            raise NotFound("run not found")
        if status in TERMINAL:
            raise RunTerminal("the run has finished; its log takes no more chunks")
        raise Conflict(f"the run is {status}, not executing on this runner; it takes no chunks")
    storage = get_storage()
    if times:
        storage.put_times(run_id, n, encode_times(times))
    return storage.presign_put(run_id, n, sha256.lower(), size)


@dataclass(frozen=True)
class UploadResult:
    created: bool


def chunk_store_upload(*, grant: UploadGrant, data: bytes) -> UploadResult:
    """Gantry's own upload URL (local storage): keep the body if it is what the grant names.

    Exactly once: the first body is kept; an identical replay (a retry whose
    first answer was lost) succeeds without writing, different bytes are a
    409 and change nothing. The run's state is not checked again, as S3 would
    not either: the grant was handed out while the runner held the run and
    expires after UPLOAD_URL_TTL.
    """
    if len(data) != grant.size:
        raise InvalidRequest(f"the upload is {len(data)} bytes, the URL was issued for {grant.size}")
    if hashlib.sha256(data).hexdigest() != grant.sha256:
        raise InvalidRequest("the upload's sha256 differs from the one the URL was issued for")
    storage = get_storage()
    if not isinstance(storage, LocalStorage):
        # S3 is configured now: this URL was issued before the switch.
        raise NotFound("uploads go to S3 on this server; ask for a new upload URL")
    if storage.put(grant.run_id, grant.n, data):
        return UploadResult(created=True)
    if storage.get(grant.run_id, grant.n) == data:
        return UploadResult(created=False)
    raise ChunkExists(f"chunk {grant.n} of this run is already stored with other content")


def flush_live_log(run_id: uuid.UUID) -> bool:
    """Write the run's last live snapshot to storage as its final chunk; True when a manifest was recorded.

    For a run whose runner was lost (the inactive-runner reaper, reconcile,
    force-delete, a GitHub workflow run that ended): the snapshot becomes chunk
    ``chunk_index`` (unless storage already has that chunk, e.g. the runner's
    own upload landed first; both writes are write-once, so whichever came
    first stays), and the run gets a manifest of ``chunk_index + 1`` chunks so
    the reader shows the partial log, with gap markers for any earlier chunk
    that never reached storage. Hashes the server cannot know (the runner's
    sealed chunks) are recorded as null: those chunks are shown unverified.

    Does nothing (False) for a run still executing (its runner may yet upload
    that chunk in full), for a run that already has a manifest (/done made
    storage authoritative), and when there is no live record. Raises when
    storage or Redis fails, leaving the live record in place for a retry. Call
    it after the run's failure has committed, outside a transaction (storage
    may be S3). :func:`flush_live_logs` is the same for many runs.
    """
    flushed = flush_live_logs([run_id])
    if run_id in flushed.failed:
        raise flushed.failed[run_id]
    return run_id in flushed.recorded


@dataclass
class Flushed:
    """What :func:`flush_live_logs` did with each run it was given."""

    # Runs that got a manifest from this call.
    recorded: set[uuid.UUID] = field(default_factory=set)
    # Runs that could not be flushed (storage or Redis failed); their live record is kept for a retry.
    failed: dict[uuid.UUID, Exception] = field(default_factory=dict)


def flush_live_logs(run_ids: list[uuid.UUID]) -> Flushed:
    """:func:`flush_live_log` for many runs: one read of the runs, one MGET, a storage write per record, one UPDATE.

    A failure is per run (``failed``) and never loses data: the run keeps no
    manifest and its live record stays in Redis, so the caller retries (the
    reaper keeps the runner row until the flush succeeds). Redis being down
    fails every run that still needs its record, rather than recording a loss
    that is not one. ``start_flush(...).finish()`` is the same in two halves,
    so a caller can do other database work while the storage writes run.
    """
    return start_flush(run_ids).finish()


def start_flush(run_ids: list[uuid.UUID]) -> PendingFlush:
    """Read the runs and their live records, and start their storage writes in threads; ``finish()`` ends it.

    The database is read here, on the caller's connection, and written only by
    ``finish()``: the threads touch storage and Redis, never the database.
    """
    return PendingFlush(run_ids)


class PendingFlush:
    """A batch flush whose storage writes are under way (see :func:`start_flush`)."""

    def __init__(self, run_ids: list[uuid.UUID]) -> None:
        self.result = Flushed()
        self.futures: dict[uuid.UUID, Future[dict[str, Any] | None]] = {}
        self.settled: list[uuid.UUID] = []
        self.records: dict[uuid.UUID, live.LiveRecord | None] = {}
        if not run_ids:
            return
        with connection.cursor() as cur:
            cur.execute(sql.FLUSH_STATE, [list(run_ids)])
            rows = {row[0]: row[1:] for row in cur.fetchall()}
        # Gone, or storage already authoritative: only the live record is left to drop.
        self.settled = [run_id for run_id in run_ids if run_id not in rows or rows[run_id][1]]
        wanted = [r for r in run_ids if r in rows and rows[r][0] in TERMINAL and not rows[r][1]]
        try:
            self.records = live.get_many(wanted)
        except (redis.RedisError, OSError) as exc:
            for run_id in wanted:
                self.result.failed[run_id] = exc
            return
        if not wanted:
            return
        storage = get_storage()

        def manifest_of(run_id: uuid.UUID) -> dict[str, Any] | None:
            record = self.records.get(run_id)
            if record is None:
                # Started: the runner was lost before its first push, or Redis lost the record.
                # Never started: no output, nothing lost.
                return _lost_manifest(run_id, storage) if rows[run_id][2] else None
            return _final_manifest(run_id, record, storage)

        # Storage round trips (an S3 PUT, a local write and its fsync) overlap in
        # a few threads: one after the other they would be most of a big sweep's time.
        pool = ThreadPoolExecutor(max_workers=min(FLUSH_THREADS, len(wanted)), thread_name_prefix="gantry-flush")
        self.futures = {run_id: pool.submit(manifest_of, run_id) for run_id in wanted}
        pool.shutdown(wait=False)  # the threads end once the writes are done

    def finish(self, release: dict[uuid.UUID, uuid.UUID] | None = None) -> Flushed:
        """Wait for the storage writes, record the manifests (one guarded UPDATE), drop the flushed live records.

        ``release`` ({run: runner}) also clears the runner pointer of those runs
        that are finished and flushed (or needed no flush), in the same UPDATE:
        for a caller about to delete the runners (the inactive reaper).
        """
        result = self.result
        manifests: dict[uuid.UUID, dict[str, Any]] = {}
        for run_id, future in self.futures.items():
            error = future.exception()
            if error is not None:
                result.failed[run_id] = error if isinstance(error, Exception) else RuntimeError(str(error))
                log.warning(
                    "live-log flush of run %s failed; its record is kept for a retry",
                    run_id,
                    exc_info=error,
                    extra={"event": "logs.flush_failed", "run_id": str(run_id)},
                )
                continue
            manifest = future.result()
            if manifest is not None:
                manifests[run_id] = manifest
        freed = {run: runner for run, runner in (release or {}).items() if run not in result.failed}
        if freed:
            ids = list(set(manifests) | set(freed))
            args: list[Any] = [
                ids,
                [json.dumps(manifests[i]) if i in manifests else None for i in ids],
                [freed.get(i) for i in ids],
            ]
            with connection.cursor() as cur:
                cur.execute(sql.RECORD_AND_RELEASE, args)
                result.recorded = {row[0] for row in cur.fetchall() if row[1]}
        elif manifests:
            ids = list(manifests)
            with connection.cursor() as cur:
                cur.execute(sql.RECORD_MANIFESTS, [ids, [json.dumps(manifests[i]) for i in ids]])
                result.recorded = {row[0] for row in cur.fetchall()}
        # Storage is authoritative for every run with a manifest now (ours or a racer's).
        live.delete_many(self.settled + [run_id for run_id in manifests if self.records.get(run_id) is not None])
        for run_id, manifest in manifests.items():
            log.info(
                "flushed the live log of run %s (%s)",
                run_id,
                "lost" if manifest.get("lost") else f"chunk {manifest.get('flushed_chunk')}",
                extra={"event": "logs.flushed_lost" if manifest.get("lost") else "logs.flushed",
                       "run_id": str(run_id), "chunks": manifest["count"], "recorded": run_id in result.recorded},
            )  # fmt: skip
        return result


def _lost_manifest(run_id: uuid.UUID, storage: LogStorage) -> dict[str, Any]:
    """Keep what storage has, and say that the rest is missing."""
    present = ChunkIndex(run_id, storage).present_count()
    return {"count": present, "sha256": [None] * present, "lost": True}


def _final_manifest(run_id: uuid.UUID, record: live.LiveRecord, storage: LogStorage | None) -> dict[str, Any]:
    """Store the live snapshot as chunk ``chunk_index`` (write-once) and answer the manifest that ends there."""
    n = record.chunk_index
    hashes: list[str | None] = [None] * n
    if gunzip(record.data) == b"":
        # Nothing was written since the last seal: no empty chunk, just the manifest.
        return {"count": n, "sha256": hashes, "flushed_chunk": None}
    assert storage is not None
    written = storage.put(run_id, n, record.data)
    if written and record.times:
        # The snapshot's marks go beside the chunk they describe (only when that chunk is this snapshot).
        storage.put_times(run_id, n, encode_times(record.times))
    # When the key was taken, the runner's own upload won; its hash is unknown here.
    hashes.append(hashlib.sha256(record.data).hexdigest() if written else None)
    return {"count": n + 1, "sha256": hashes, "flushed_chunk": n}
