"""The runner's side of the log contract (docs/logs.md).

:class:`LogBuffer` cuts the byte stream of a run into chunks: the **active**
chunk grows until it holds ``chunk_size`` bytes or is ``seal_interval`` seconds
old, then it is **sealed** (numbered 0, 1, 2, … in order) and queued for
upload. Past ``max_bytes`` it records a truncation line and drops the rest (the
pipe is still drained, so a chatty step never blocks on a full pipe).

:class:`LogShipper` runs the two threads around it: the uploader (gzip,
sha256, chunk handout, PUT — each chunk exactly once, retried on transient
errors with the *same* bytes, which the PUT accepts idempotently) and the
live pusher (a snapshot of the active chunk to ``logs/live`` as soon as
output appears, coalesced by :func:`live_gap`; never an unchanged one).

The hot path is :meth:`LogBuffer.write`, called with blocks of up to 1 MiB
read straight from the step's pipe: a slice and an append, no per-line work.
Line times cost one clock read per write: the buffer keeps, per chunk, marks
``[offset in the chunk, epoch ms]`` (one when a chunk begins, one per write at
least ``TIME_MARK_EVERY_MS`` after the last), sent beside the chunk's bytes with
the live push and the chunk handout, never inside them (docs/logs.md).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gantry_wire.logsetup import event
from gantry_wire.protocol import TIME_MARK_EVERY_MS, TIME_MARKS_MAX, truncation_line
from runners.client import ApiError, GantryClient, RetryPolicy

log = logging.getLogger("gantry.runner.logs")

# gzip level for sealed and live chunks. Measured on numbered lines: level 1
# takes 18 ms per MiB and level 6 76 ms, for output only 6% smaller; the
# runner's CPU belongs to the steps, so the cheap level wins.
COMPRESS_LEVEL = 1
# Sealed chunks waiting for the uploader before writes block (backpressure
# onto the step's pipe rather than unbounded memory when storage is slow).
MAX_PENDING_CHUNKS = 8

# The live push's pacing (docs/logs.md, "Live push"). Output is pushed as soon
# as it appears, but two pushes are at least LIVE_BATCH_S apart, so a chatty
# step's lines coalesce and a run pushes at most 1 / LIVE_BATCH_S times a second.
LIVE_BATCH_S = 0.2
# Each push carries the whole active chunk: the gap grows with it so that at
# most this many raw snapshot bytes a second are gzipped and sent (a 1 MiB
# chunk: one push every 2 s, as the old fixed tick).
LIVE_BYTES_PER_S = 512 * 1024


def live_gap(snapshot_bytes: int, live_interval: float) -> float:
    """The least time between two live pushes when the active chunk holds ``snapshot_bytes``.

    ``live_interval`` (GANTRY_LIVE_LOG_INTERVAL) caps it: it is the longest a
    new line waits, so past ``live_interval * LIVE_BYTES_PER_S`` bytes the rate
    is one push per ``live_interval``, the old tick's.
    """
    return min(max(LIVE_BATCH_S, snapshot_bytes / LIVE_BYTES_PER_S), max(LIVE_BATCH_S, live_interval))


def gzip_bytes(data: bytes) -> bytes:
    # mtime=0: the same chunk always gzips to the same bytes, so a retried PUT
    # after a lost answer carries exactly what the first one did (same sha256).
    return gzip.compress(data, compresslevel=COMPRESS_LEVEL, mtime=0)


class LogBuffer:
    def __init__(
        self,
        *,
        chunk_size: int,
        seal_interval: float,
        max_bytes: int,
        max_pending: int = MAX_PENDING_CHUNKS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        self.chunk_size = chunk_size
        self.seal_interval = seal_interval
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self._clock = clock
        self._wall = wall
        # The active chunk's time marks, and the sealed chunks' until the uploader takes them.
        self._marks: list[list[int]] = []
        self._sealed_marks: dict[int, list[list[int]]] = {}
        self._cond = threading.Condition()
        self._active = bytearray()
        self._active_index = 0
        self._active_since: float | None = None
        self._pending: deque[tuple[int, bytes]] = deque()
        self._closed = False
        self.recorded = 0  # bytes kept, truncation line included
        self.dropped = 0  # bytes past max_bytes
        self.truncated = False
        self._marker = truncation_line(max_bytes)
        self._last = b""  # the last byte recorded: does the log end a line?
        # Set on every write: the live pusher sleeps on it instead of ticking.
        self.news = threading.Event()

    # ------------------------------------------------------------ writing (the reader thread)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        with self._cond:
            if self._closed:
                raise ValueError("write to a closed log")
            if self.truncated:
                self.dropped += len(view)
                return
            # The marker (on a line of its own) fits inside max_bytes, so the
            # log never exceeds it and the server has nothing left to cut.
            room = max(self.max_bytes - len(self._marker) - 1 - self.recorded, 0)
            if len(view) > room:
                kept = view[:room]
                self._append(kept)
                self.dropped += len(view) - room
                ends_line = (bytes(kept[-1:]) if len(kept) else self._last) in (b"\n", b"")
                self._append(memoryview(self._marker if ends_line else b"\n" + self._marker))
                self.truncated = True
            else:
                self._append(view)
        self._wait_for_room()

    def _append(self, view: memoryview) -> None:
        """Append under the lock, sealing every time the active chunk fills."""
        if len(view):
            self._last = bytes(view[-1:])
            now_ms = int(self._wall() * 1000)
        while len(view):
            if not self._active:
                self._active_since = self._clock()
                self._marks = [[0, now_ms]]
            elif now_ms - self._marks[-1][1] >= TIME_MARK_EVERY_MS and len(self._marks) < TIME_MARKS_MAX:
                self._marks.append([len(self._active), now_ms])
            space = self.chunk_size - len(self._active)
            self._active += view[:space]
            self.recorded += min(space, len(view))
            view = view[space:]
            if len(self._active) >= self.chunk_size:
                self._seal()
        self.news.set()

    def _seal(self) -> None:
        self._pending.append((self._active_index, bytes(self._active)))
        self._sealed_marks[self._active_index] = self._marks
        self._marks = []
        self._active_index += 1
        self._active = bytearray()
        self._active_since = None
        self._cond.notify_all()

    def _wait_for_room(self) -> None:
        with self._cond:
            while len(self._pending) > self.max_pending and not self._closed:
                self._cond.wait(1.0)

    def seal_if_due(self) -> bool:
        """The time bound: seal a non-empty active chunk that is ``seal_interval`` old."""
        with self._cond:
            since = self._active_since
            if self._active and since is not None and self._clock() - since >= self.seal_interval:
                self._seal()
                return True
        return False

    def close(self) -> None:
        """Seal what is left; no more writes. Idempotent."""
        with self._cond:
            if not self._closed:
                if self._active:
                    self._seal()
                self._closed = True
                self._cond.notify_all()

    # ------------------------------------------------------------ reading (uploader, ticker)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def sealed_count(self) -> int:
        """Chunks sealed so far (the index the active chunk has)."""
        with self._cond:
            return self._active_index

    def next_sealed(self, timeout: float) -> tuple[int, bytes] | None:
        """The oldest sealed chunk not yet taken, waiting up to ``timeout``; None if none (yet)."""
        with self._cond:
            if not self._pending and not self._closed:
                self._cond.wait(timeout)
            if not self._pending:
                return None
            item = self._pending.popleft()
            self._cond.notify_all()  # a writer may be waiting for room
            return item

    def take_marks(self, n: int) -> list[list[int]]:
        """Sealed chunk ``n``'s time marks (once: the uploader sends them with the chunk's handout)."""
        with self._cond:
            return self._sealed_marks.pop(n, [])

    def drained(self) -> bool:
        with self._cond:
            return self._closed and not self._pending

    def snapshot(self) -> tuple[int, bytes]:
        """The active chunk's index and a copy of its bytes (a prefix of that chunk once sealed)."""
        with self._cond:
            return self._active_index, bytes(self._active)

    def live_snapshot(self) -> tuple[int, bytes, list[list[int]]]:
        """:meth:`snapshot` and the active chunk's time marks so far, taken together."""
        with self._cond:
            return self._active_index, bytes(self._active), [list(m) for m in self._marks]


@dataclass
class Manifest:
    count: int
    sha256: list[str]
    uploaded: int  # chunks durably stored, counted from 0 without a gap

    def as_dict(self) -> dict[str, object]:
        return {"count": self.count, "sha256": list(self.sha256)}


class LogShipper:
    """Uploads sealed chunks and pushes live snapshots of the active one, each in its own thread."""

    def __init__(
        self,
        client: GantryClient,
        run_id: str,
        buf: LogBuffer,
        *,
        live_interval: float,
        upload_deadline: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.buf = buf
        # The longest new output waits for its push (and the quiet pusher's
        # period: the time bound's seals are checked this often).
        self.live_interval = live_interval
        self._clock = clock
        # How long one chunk's upload may keep failing before it is given up:
        # the manifest still names it, so the reader shows an explicit gap.
        self.upload_deadline = upload_deadline
        self._hashes: dict[int, str] = {}
        self._stored: set[int] = set()
        self._uploaded = 0
        self._lock = threading.Lock()
        self._stop_ticker = threading.Event()
        # Set when finish() ran out of patience: the uploader hashes what is left without uploading it.
        self._abandon = threading.Event()
        self._uploader = threading.Thread(target=self._upload_loop, name="log-uploader", daemon=True)
        self._ticker = threading.Thread(target=self._tick_loop, name="log-live", daemon=True)
        self.chunks_put = 0
        self.live_pushes = 0
        self.failed_chunks: list[int] = []

    def start(self) -> None:
        self._uploader.start()
        self._ticker.start()

    @property
    def uploaded(self) -> int:
        with self._lock:
            return self._uploaded

    def finish(self, timeout: float = 600.0) -> Manifest:
        """Seal the rest, stop live pushes, wait for every sealed chunk's upload; answer the manifest.

        The ticker is joined before this returns so that no live push can
        land after ``/done`` (which deletes the live record).
        """
        self.buf.close()
        self._stop_ticker.set()
        self.buf.news.set()
        if self._ticker.is_alive():
            self._ticker.join(timeout=30)
        if self._uploader.is_alive():
            self._uploader.join(timeout=timeout)
        if self._uploader.is_alive():
            # Storage is too slow or down: give up on the rest, but still name
            # every chunk in the manifest, so the reader shows the gaps.
            self._abandon.set()
            self._uploader.join(timeout=60)
        count = self.buf.sealed_count
        with self._lock:
            # A hash is missing only if the uploader is stuck inside one request;
            # a hash that matches nothing makes the reader mark that chunk missing.
            hashes = [self._hashes.get(i, "0" * 64) for i in range(count)]
            return Manifest(count=count, sha256=hashes, uploaded=self._uploaded)

    # ------------------------------------------------------------ uploader

    def _upload_loop(self) -> None:
        while True:
            item = self.buf.next_sealed(timeout=1.0)
            if item is None:
                if self.buf.drained():
                    return
                continue
            index, raw = item
            marks = self.buf.take_marks(index)
            data = gzip_bytes(raw)
            digest = hashlib.sha256(data).hexdigest()
            with self._lock:
                self._hashes[index] = digest
            if self._abandon.is_set():
                self.failed_chunks.append(index)
            elif self._upload(index, data, digest, marks):
                with self._lock:
                    self._stored.add(index)
                    while self._uploaded in self._stored:
                        self._uploaded += 1
                self.buf.news.set()  # sealed_chunks advanced: worth a push
            else:
                self.failed_chunks.append(index)

    def _upload(self, index: int, data: bytes, digest: str, marks: list[list[int]] | None = None) -> bool:
        deadline = time.monotonic() + self.upload_deadline
        policy = RetryPolicy(base=0.5, cap=15.0)
        attempt = 0
        put_refusals = 0
        while True:
            attempt += 1
            try:
                upload = self.client.chunk_upload(self.run_id, index, sha256=digest, size=len(data), times=marks)
            except ApiError as exc:
                if not exc.transient:  # Gantry refused the chunk itself: asking again changes nothing
                    return self._give_up(index, f"handout refused: {exc}")
                error: ApiError = exc
            else:
                try:
                    self.client.put_chunk(upload, data)
                    self.chunks_put += 1
                    return True
                except ApiError as exc:
                    if exc.status == 412:
                        # S3's write-once guard (If-None-Match: *): the key is taken,
                        # by our own earlier PUT whose answer was lost. The manifest's
                        # hash lets the reader tell if it is anything else.
                        event(log, "log.chunk_exists", "chunk %d was already stored", index,
                              run_id=self.run_id, chunk=index)  # fmt: skip
                        return True
                    # Storage refusing the PUT (an expired presigned URL, say) is
                    # worth a fresh handout or two; more than that is final.
                    if not exc.transient:
                        put_refusals += 1
                        if put_refusals > 2:
                            return self._give_up(index, f"storage refused the PUT: {exc}")
                    error = exc
            if time.monotonic() >= deadline or self._abandon.is_set():
                return self._give_up(index, f"not uploaded within {self.upload_deadline:g}s: {error}")
            event(log, "log.chunk_retry", "chunk %d upload failed, retrying: %s", index, error,
                  level=logging.WARNING, run_id=self.run_id, chunk=index)  # fmt: skip
            self._abandon.wait(min(policy.delay(attempt), max(0.0, deadline - time.monotonic())))

    def _give_up(self, index: int, why: str) -> bool:
        event(log, "log.chunk_failed", "chunk %d lost: %s", index, why, level=logging.ERROR,
              run_id=self.run_id, chunk=index)  # fmt: skip
        return False

    # ------------------------------------------------------------ live pusher

    def _tick_loop(self) -> None:
        """Push the active chunk when it changed: the first output at once, then at most once per :func:`live_gap`.

        Sleeps on the buffer's ``news`` (a write, an upload) with
        ``live_interval`` as the timeout, so a quiet run costs no call and the
        seal-on-age check still runs that often. Deduped: an unchanged
        snapshot (same chunk, length and sealed count) is never pushed.
        """
        last: tuple[int, int, int] = (0, 0, 0)  # nothing written, nothing stored: nothing to say
        pushed_at: float | None = None
        news = self.buf.news
        while not self._stop_ticker.is_set():
            news.wait(self.live_interval)
            news.clear()  # before the snapshot: a write after it sets it again
            if self._stop_ticker.is_set():
                return
            self.buf.seal_if_due()
            index, active, marks = self.buf.live_snapshot()
            key = (index, len(active), self.uploaded)
            if key == last:
                continue  # deduped: an unchanged snapshot costs no HTTP call
            while pushed_at is not None:
                # Coalesce: what the step writes meanwhile rides in this push. The
                # gap is judged again on the snapshot that grew while it waited.
                delay = pushed_at + live_gap(len(active), self.live_interval) - self._clock()
                if delay <= 0:
                    break
                if self._stop_ticker.wait(delay):
                    return
                index, active, marks = self.buf.live_snapshot()
                key = (index, len(active), self.uploaded)
            pushed_at = self._clock()
            try:
                self.client.live_push(
                    self.run_id,
                    chunk_index=index,
                    sealed_chunks=key[2],
                    data=base64.b64encode(gzip_bytes(active)).decode("ascii"),
                    times=marks,
                )
                self.live_pushes += 1
                last = key
            except ApiError as exc:
                # Best effort by contract: a failed push never fails the run.
                event(log, "log.live_failed", "live push failed: %s", exc, level=logging.DEBUG, run_id=self.run_id)
