"""The live record: one Redis key per run holding the runner's latest snapshot of its active chunk.

Best-effort by design (docs/design.md, "Live Log Push"): every call here
swallows Redis errors. Without Redis a push is dropped and the log shows up
chunk by chunk as chunks seal; nothing in a run's life depends on this record.

A record is one value, ``<json header>\\n<gzip bytes>``, written with a single
``SET … EX``, so a push replaces the previous one atomically and a reader never
sees the header of one push with the data of another.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass

import redis

from gantry import conf
from gantry.logs.limits import CHUNK_GZIP_MAX, CHUNK_TEXT_MAX, TIME_MARKS_MAX
from gantry.redis import client
from gantry.ticker import Ticker

log = logging.getLogger("gantry.logs")

KEY = "gantry:logs:live:{run_id}"
# PUBLISHed (payload: the run id) whenever the record changes (a push, its
# deletion): a reader parked on ``GET /runs/{id}/logs?wait=`` reads again.
CHANNEL = "gantry:logs:changed:{run_id}"
# Set (NX) by the first push that carries output: that push, and only it,
# stamps run.first_output_at (one database write per run).
FIRST_KEY = "gantry:logs:first:{run_id}"


# The environ key under which gantry.server.asgi hands the log read view a Park.
PARK_ENVIRON_KEY = "gantry.logs.park"
# ``wait`` on the log read: at most this many seconds.
WAIT_MAX = 30


@dataclass
class Park:
    """Set by the log read view under gantry.asgi: how long the event loop may hold its answer (0: send it)."""

    wait: float = 0.0


@dataclass(frozen=True)
class LiveRecord:
    chunk_index: int
    sealed_chunks: int
    # gzip of the active chunk's bytes, exactly as the runner sent it.
    data: bytes
    pushed_at: float
    # The chunk's time marks ([offset in the chunk, epoch ms], docs/logs.md), when the runner sent them.
    times: list[list[int]] | None = None


def ttl_seconds() -> int:
    """How long a record outlives its last push.

    The inactive-runner reaper fails a run once its runner has been silent for
    GANTRY_RUNNER_EXECUTION_TIMEOUT, checked every GANTRY_REAPER_INTERVAL, and
    then flushes this record; it must still be there at that moment. A runner
    whose output is quiet stops pushing (unchanged ticks are skipped) while it
    keeps polling, but by then its chunk has sealed on the time bound, so an
    expired record never hides bytes that are not in storage.
    """
    cfg = conf.get()
    return cfg.runner_execution_timeout + 2 * cfg.reaper_interval + 600


def _key(run_id: uuid.UUID) -> str:
    return KEY.format(run_id=run_id)


# Warn once per outage, then stay at DEBUG: a push every 2 s per running run
# would otherwise flood the log while Redis is down.
_warned = False


def _unavailable(action: str, exc: Exception) -> None:
    global _warned
    log.log(
        logging.DEBUG if _warned else logging.WARNING,
        "live log %s skipped: Redis unavailable (%s)",
        action,
        exc,
        extra={"event": "logs.redis_unavailable", "action": action},
    )
    _warned = True


def _available() -> None:
    global _warned
    _warned = False


GZIP_MAGIC = b"\x1f\x8b"
# A push's ``data``: base64 makes 4 characters of 3 bytes.
PUSH_DATA_MAX_LENGTH = (CHUNK_GZIP_MAX + 2) // 3 * 4


def push_data(value: str) -> bytes:
    """A push's ``data`` (base64 of the active chunk's gzip) as bytes; ValueError names what is wrong.

    Only the magic number is checked: decompressing on every push would cost
    the server more than the push is worth; the reader skips a bad snapshot.
    """
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None
    if not raw.startswith(GZIP_MAGIC):
        raise ValueError("not a gzip (base64 of gzip bytes expected)")
    if len(raw) > CHUNK_GZIP_MAX:
        raise ValueError(f"more than {CHUNK_GZIP_MAX} bytes of gzip")
    return raw


# Epoch milliseconds a time mark may carry (JSON numbers stay exact up to 2**53).
TIME_MS_MAX = 2**53


def time_marks(value: object) -> list[list[int]] | None:
    """A push's or handout's ``times`` (docs/logs.md, "Line times"), checked; ValueError names what is wrong.

    A list of at most TIME_MARKS_MAX ``[offset, ms]`` pairs of integers, offsets
    strictly increasing from 0 up and inside a chunk, ms from 0 to 2**53. None
    (or absent) is a runner that records no times. Times are the runner's
    clock and may go backwards; only offsets must be ordered.
    """
    if value is None:
        return None
    if type(value) is not list:
        raise ValueError("times must be a list of [offset, ms] pairs")
    if len(value) > TIME_MARKS_MAX:
        raise ValueError(f"times holds at most {TIME_MARKS_MAX} marks per chunk")
    last = -1
    for mark in value:
        if type(mark) is not list or len(mark) != 2 or type(mark[0]) is not int or type(mark[1]) is not int:
            raise ValueError("each time mark is [offset, ms], two integers")
        offset, ms = mark
        if not last < offset < CHUNK_TEXT_MAX:
            raise ValueError("time mark offsets must increase, from 0, and lie inside the chunk")
        if not 0 <= ms <= TIME_MS_MAX:
            raise ValueError("a time mark's ms must be epoch milliseconds (0 to 2**53)")
        last = offset
    return value


def channel(run_id: uuid.UUID | str) -> str:
    return CHANNEL.format(run_id=run_id)


def has_output(*, chunk_index: int, sealed_chunks: int, data: bytes) -> bool:
    """Whether a push carries any log bytes, without decompressing: a gzip ends with its input's
    length mod 2**32 (RFC 1952, ISIZE), and a later chunk means earlier ones held bytes."""
    return chunk_index > 0 or sealed_chunks > 0 or (len(data) >= 4 and data[-4:] != b"\0\0\0\0")


@dataclass(frozen=True)
class Stored:
    stored: bool  # False: Redis unavailable, the push dropped
    first_output: bool = False  # this push is the run's first with output (its FIRST_KEY was set here)

    def __bool__(self) -> bool:
        return self.stored


def store(
    run_id: uuid.UUID, *, chunk_index: int, sealed_chunks: int, data: bytes, times: list[list[int]] | None = None
) -> Stored:
    """Replace the run's record and tell its parked readers, in one round trip; ``stored`` False when Redis
    is unavailable (the push is dropped). ``first_output``: see FIRST_KEY."""
    meta: dict[str, object] = {"chunk_index": chunk_index, "sealed_chunks": sealed_chunks, "at": time.time()}
    if times:
        meta["times"] = times
    header = json.dumps(meta, separators=(",", ":"))
    mark = has_output(chunk_index=chunk_index, sealed_chunks=sealed_chunks, data=data)
    try:
        pipe = client().pipeline(transaction=False)
        pipe.set(_key(run_id), header.encode() + b"\n" + data, ex=ttl_seconds())
        pipe.publish(channel(run_id), str(run_id))
        if mark:
            pipe.set(FIRST_KEY.format(run_id=run_id), b"1", nx=True, ex=ttl_seconds())
        replies = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        _unavailable("push", exc)
        return Stored(False)
    _available()
    return Stored(True, first_output=mark and bool(replies[2]))


def forget_first(run_id: uuid.UUID) -> None:
    """Drop the first-output marker (its database stamp failed: the next push with output tries again)."""
    delete_many([], FIRST_KEY.format(run_id=run_id))


def get(run_id: uuid.UUID) -> LiveRecord | None:
    """The run's record, or None (none pushed, expired, deleted, or Redis unavailable)."""
    try:
        raw = client().get(_key(run_id))
    except (redis.RedisError, OSError) as exc:
        _unavailable("read", exc)
        return None
    _available()
    return _parse(run_id, raw)


def get_many(run_ids: list[uuid.UUID]) -> dict[uuid.UUID, LiveRecord | None]:
    """The records of many runs in one round trip (MGET), for the reapers' flush.

    Unlike :func:`get` this raises on a Redis error: the flush must tell "no
    record" (the loss is recorded for good) from "Redis is down" (retry later).
    """
    if not run_ids:
        return {}
    raws = client().mget([_key(run_id) for run_id in run_ids])
    return {run_id: _parse(run_id, raw) for run_id, raw in zip(run_ids, raws, strict=True)}


def _parse(run_id: uuid.UUID, raw: object) -> LiveRecord | None:
    if not isinstance(raw, bytes):
        return None
    header, sep, data = raw.partition(b"\n")
    try:
        meta = json.loads(header)
        record = LiveRecord(
            chunk_index=int(meta["chunk_index"]),
            sealed_chunks=int(meta["sealed_chunks"]),
            data=data,
            pushed_at=float(meta["at"]),
            times=meta.get("times"),
        )
    except (ValueError, KeyError, TypeError):
        log.warning("unreadable live log record for run %s", run_id, extra={"event": "logs.live_unreadable"})
        return None
    return record if sep else None


def delete(run_id: uuid.UUID) -> None:
    """Drop the run's record (after /done, or once flushed to storage)."""
    delete_many([run_id])


# Records dropped a moment late, many per round trip (delete_soon).
DELETE_SOON_SECONDS = 1.0
_doomed: list[uuid.UUID] = []
_doomed_lock = threading.Lock()


def delete_soon(run_id: uuid.UUID) -> None:
    """Drop the run's record within :data:`DELETE_SOON_SECONDS`, together with others: for /done (either path).

    A finished run's reader goes by its manifest (written by /done itself)
    and ignores the record, so dropping it a second later changes no answer;
    it spares the hot call its only Redis round trip. Best-effort as
    :func:`delete`: a record the sweep misses expires by its TTL.
    """
    with _doomed_lock:
        _doomed.append(run_id)
    _sweep.start()


def flush_deletes() -> None:
    """Drop now every record :func:`delete_soon` was given (the sweep's tick, and at exit)."""
    with _doomed_lock:
        run_ids = _doomed[:]
        _doomed.clear()
    delete_many(run_ids)


_sweep = Ticker("gantry-live-sweep", DELETE_SOON_SECONDS, flush_deletes)


def delete_many(run_ids: list[uuid.UUID], *extra_keys: str) -> None:
    """Drop the records of many runs (and any ``extra_keys``) in one round trip; best-effort like :func:`delete`.

    Each run's parked readers are told (its record is gone: the run has
    finished, and its log is now the sealed chunks).
    """
    keys = [_key(run_id) for run_id in run_ids] + [FIRST_KEY.format(run_id=run_id) for run_id in run_ids]
    keys += extra_keys
    if not keys:
        return
    try:
        pipe = client().pipeline(transaction=False)
        pipe.delete(*keys)
        for run_id in run_ids:
            pipe.publish(channel(run_id), str(run_id))
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        # It expires on its own; the reader ignores it once the run has a manifest.
        _unavailable("delete", exc)
        return
    _available()
