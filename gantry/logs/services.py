"""The writes of the logs app: live pushes, chunk uploads, and the reaper's flush (docs/logs.md).

Storage calls (S3 round trips) are made outside any transaction; the only
database writes are one guarded UPDATE of ``run.log_manifest``.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from gantry.core import prepared
from gantry.core.errors import ChunkExists, Conflict, InvalidRequest, NotFound, RunTerminal
from gantry.core.models import EXECUTING, TERMINAL, Run
from gantry.logs import live
from gantry.logs.limits import CHUNK_GZIP_MAX, MAX_CHUNKS
from gantry.logs.manifest import is_sha256
from gantry.logs.reader import ChunkIndex, gunzip
from gantry.logs.storage import LocalStorage, PresignedPut, UploadGrant, get_storage

log = logging.getLogger("gantry.logs")


# A live push comes every few seconds from every running runner: its check is
# one prepared EXECUTE, not an ORM query compiled per push (docs/performance.md,
# "Runner routes"). The statuses are literals, so the plan is fixed.
_HELD = prepared.Statement(
    "log_held",
    "SELECT EXISTS (SELECT 1 FROM run WHERE id = %(run)s AND assigned_runner_id = %(runner)s AND status IN ("
    + ", ".join(f"'{status}'" for status in sorted(EXECUTING))
    + "))",
    [("run", "uuid"), ("runner", "uuid")],
)


def _held(run_id: uuid.UUID, runner_id: uuid.UUID) -> bool:
    """The runner is executing the run (accepted, not finished)."""
    row = prepared.fetchone(_HELD, {"run": run_id, "runner": runner_id})
    return bool(row and row[0])


def live_push(*, run_id: uuid.UUID, runner_id: uuid.UUID, chunk_index: int, sealed_chunks: int, data: bytes) -> bool:
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
    return live.store(run_id, chunk_index=chunk_index, sealed_chunks=sealed_chunks, data=data)


def chunk_upload_url(*, run_id: uuid.UUID, runner_id: uuid.UUID, n: int, sha256: str, size: int) -> PresignedPut:
    """A presigned PUT for sealed chunk ``n``, only while the runner executes the run."""
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
    return get_storage().presign_put(run_id, n, sha256.lower(), size)


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

    For the inactive-runner reaper, after it failed a run whose runner was
    lost: the snapshot becomes chunk ``chunk_index`` (unless storage already
    has that chunk, e.g. the runner's own upload landed first; both writes are
    write-once, so whichever came first stays), and the run gets a manifest of
    ``chunk_index + 1`` chunks so the reader shows the partial log, with gap
    markers for any earlier chunk that never reached storage. Hashes the
    server cannot know (the runner's sealed chunks) are recorded as null:
    those chunks are shown unverified.

    Does nothing (False) for a run still executing (its runner may yet upload
    that chunk in full), for a run that already has a manifest (/done made
    storage authoritative), and when there is no live record. Call it after
    the run's failure has committed, outside a transaction (storage may be S3).
    """
    row = Run.objects.filter(id=run_id).values("status", "log_manifest", "started_at").first()
    if row is None:
        live.delete(run_id)
        return False
    if row["status"] not in TERMINAL:
        return False
    if row["log_manifest"] is not None:
        live.delete(run_id)
        return False
    record = live.get(run_id)
    if record is None:
        if row["started_at"] is None:
            return False  # never started: no output, nothing lost
        # The runner was lost before its first live push, or Redis lost the
        # record: keep what storage has, and say that the rest is missing.
        present = ChunkIndex(run_id, get_storage()).present_count()
        lost: dict[str, Any] = {"count": present, "sha256": [None] * present, "lost": True}
        recorded = Run.objects.filter(id=run_id, log_manifest__isnull=True).update(log_manifest=lost) == 1
        log.info(
            "no live log for run %s; recorded %d stored chunk(s) and the loss",
            run_id,
            present,
            extra={"event": "logs.flushed_lost", "run_id": str(run_id), "chunks": present, "recorded": recorded},
        )
        return recorded
    n = record.chunk_index
    hashes: list[str | None] = [None] * n
    text = gunzip(record.data)
    if text == b"":
        # Nothing was written since the last seal: no empty chunk, just the manifest.
        count = n
    else:
        count = n + 1
        written = get_storage().put(run_id, n, record.data)
        # When the key was taken, the runner's own upload won; its hash is unknown here.
        hashes.append(hashlib.sha256(record.data).hexdigest() if written else None)
    manifest: dict[str, Any] = {"count": count, "sha256": hashes, "flushed_chunk": n if count > n else None}
    # Guarded: never overwrite a manifest, whoever wrote it first.
    recorded = Run.objects.filter(id=run_id, log_manifest__isnull=True).update(log_manifest=manifest) == 1
    live.delete(run_id)
    log.info(
        "flushed the live log of run %s as chunk %s",
        run_id,
        n,
        extra={"event": "logs.flushed", "run_id": str(run_id), "chunk": n, "recorded": recorded},
    )
    return recorded
