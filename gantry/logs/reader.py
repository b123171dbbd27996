"""Reading a run's log: sealed chunks in order, gap markers, truncation, then the live chunk.

The log is a **byte stream**; ``offset`` and ``next_offset`` are byte offsets
into it (the UTF-8 bytes the runner captured, with Gantry's marker lines
spliced in). The stream is, in order:

1. for each chunk ``0..count-1``: its decompressed bytes, or a marker line
   ``[gantry: log chunk N missing]`` / ``[gantry: log chunk N corrupt]``
   (preceded by a newline when the bytes before it do not end one);
2. for a run without a manifest whose live record is the next chunk
   (``chunk_index == count``): the live snapshot's bytes;
3. everything past ``GANTRY_LOG_MAX_BYTES`` is cut and replaced by one line
   ``[gantry: log truncated at N bytes (GANTRY_LOG_MAX_BYTES)]``;
4. for a run whose runner was lost (the run failed without the runner's
   /done, and the server kept what it had: the manifest the flush recorded),
   a last line ``[gantry: the runner was lost; any output after this point is
   missing]``, so lost output is never silent.

``complete`` is true only for a log Gantry knows to be whole: the run has
ended, not as a lost runner's (see 4), and every chunk its manifest lists was
read back intact. ``final`` is true once the run has ended and the page reaches the end
of what will ever be there (a follower stops on it): a lost runner's log, or
one with a missing chunk, is final but not complete.

``count`` and the expected hashes come from the run's manifest once it has one
(/done, or the reaper's flush); before that from the live record's
``sealed_chunks``; without either, from probing storage for chunks 0, 1, ...

One answer holds at most ``PAGE_BYTES`` of the stream. It never ends inside a
UTF-8 character: an unfinished multi-byte sequence at its end is held back
(``next_offset`` stops before it) unless the log is complete, so pages
concatenate to exactly the log and a char split by a chunk or page boundary
arrives whole. Bytes that are not UTF-8 decode as U+FFFD.

Following is cheap: per chunk, its sha256, decompressed length and whether it
ends with a newline are cached in Redis (``gantry:logs:index:<run>``; chunks
are write-once, so an entry never goes stale). An offset then maps to its
starting chunk without downloading the chunks before it, and each page fetches
only the one or two chunks it overlaps. Without Redis the reader still answers
correctly, at the cost of reading the chunks before the offset again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from gantry import conf
from gantry.core.models import TERMINAL, Run
from gantry.logs import live
from gantry.logs.limits import CHUNK_TEXT_MAX, MAX_CHUNKS, PAGE_BYTES
from gantry.logs.storage import LogStorage, decode_times, get_storage
from gantry.redis import client
from gantry_wire.protocol import truncation_line

log = logging.getLogger("gantry.logs")

INDEX_KEY = "gantry:logs:index:{run_id}"
# Long enough that a log being read is never re-indexed; entries are cheap to rebuild.
INDEX_TTL = 7 * 24 * 3600


def missing_line(n: int) -> bytes:
    return f"[gantry: log chunk {n} missing]\n".encode()


def lost_line() -> bytes:
    return b"[gantry: the runner was lost; any output after this point is missing]\n"


def corrupt_line(n: int) -> bytes:
    return f"[gantry: log chunk {n} corrupt]\n".encode()


def gunzip(data: bytes, *, limit: int = CHUNK_TEXT_MAX) -> bytes | None:
    """The bytes inside a gzip (one or more members); None when it is not a whole gzip or expands past ``limit``."""
    if not data:
        return None
    out: list[bytes] = []
    total = 0
    rest = data
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            piece = d.decompress(rest, limit - total + 1)
            total += len(piece)
            if total > limit or not d.eof:  # too big, or cut short
                return None
            out.append(piece)
            rest = d.unused_data
    except zlib.error:
        return None
    return b"".join(out)


def incomplete_tail(data: bytes | bytearray) -> int:
    """How many bytes at the end of ``data`` start a UTF-8 character that is not finished yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead
            continue
        if 0xC2 <= byte <= 0xF4:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if need > back else 0
        return 0  # ASCII or a byte no character starts with
    return 0


# ---------------------------------------------------------------- chunk index


@dataclass(frozen=True)
class ChunkInfo:
    sha256: str  # of the stored gzip bytes
    length: int | None  # decompressed length; None when the gzip is unreadable
    ends_with_newline: bool

    def encode(self) -> bytes:
        return f"{self.sha256}:{-1 if self.length is None else self.length}:{int(self.ends_with_newline)}".encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> ChunkInfo | None:
        try:
            sha, length, nl = (raw.decode() if isinstance(raw, bytes) else raw).split(":")
            size = int(length)
            return cls(sha256=sha, length=None if size < 0 else size, ends_with_newline=nl == "1")
        except ValueError:
            return None


class ChunkIndex:
    """What the reader knows of a run's stored chunks, cached in Redis (best-effort)."""

    def __init__(self, run_id: uuid.UUID, storage: LogStorage) -> None:
        self.run_id = run_id
        self.storage = storage
        self.key = INDEX_KEY.format(run_id=run_id)
        self.known: dict[int, ChunkInfo] = {}
        self.new: dict[int, ChunkInfo] = {}
        # Decompressed bytes fetched during this request, so a chunk is read once per page.
        self.text: dict[int, bytes] = {}
        try:
            cached = client().hgetall(self.key)
        except (redis.RedisError, OSError):
            cached = {}
        for k, v in cached.items():
            info = ChunkInfo.decode(v)
            if info is not None:
                self.known[int(k)] = info

    def info(self, n: int) -> ChunkInfo | None:
        """Chunk ``n``'s info, downloading it when not known yet; None when storage lacks it."""
        found = self.known.get(n)
        if found is not None:
            return found
        self._fetch(n)
        return self.known.get(n)

    def bytes(self, n: int) -> bytes:
        if n not in self.text:
            self._fetch(n)
        if n not in self.text:
            # Indexed as present, gone from storage (deleted by hand or by a
            # retention rule): forget it, so the next read shows the gap marker.
            log.warning(
                "log chunk %s of run %s vanished from storage", n, self.run_id, extra={"event": "logs.vanished"}
            )
            self.known.pop(n, None)
            self.new.pop(n, None)
            with contextlib.suppress(redis.RedisError, OSError):
                client().hdel(self.key, str(n))
            return b""
        return self.text[n]

    def _fetch(self, n: int) -> None:
        raw = self.storage.get(self.run_id, n)
        if raw is None:
            return  # absence is never cached: the chunk may still arrive
        text = gunzip(raw)
        info = ChunkInfo(
            sha256=hashlib.sha256(raw).hexdigest(),
            length=None if text is None else len(text),
            ends_with_newline=text is not None and text.endswith(b"\n"),
        )
        self.text[n] = text or b""
        if n not in self.known:
            self.known[n] = info
            self.new[n] = info

    def present_count(self) -> int:
        """How many chunks 0, 1, 2, ... storage holds without a gap (known ones are not asked again)."""
        n = 0
        while n < MAX_CHUNKS and (n in self.known or self.storage.exists(self.run_id, n)):
            n += 1
        return n

    def save(self) -> None:
        if not self.new:
            return
        try:
            with client().pipeline(transaction=False) as pipe:
                pipe.hset(self.key, mapping={str(n): info.encode() for n, info in self.new.items()})
                pipe.expire(self.key, INDEX_TTL)
                pipe.execute()
        except (redis.RedisError, OSError):
            pass  # a cold cache only costs downloads
        self.new.clear()


# ---------------------------------------------------------------- the stream


@dataclass
class Segment:
    length: int
    ends_with_newline: bool
    load: Callable[[], bytes]
    # The segment's time marks ([offset in the segment, epoch ms]); None for the server's own marker lines.
    marks: Callable[[], list[list[int]] | None] | None = None


@dataclass(frozen=True)
class LogPage:
    text: str
    next_offset: int
    complete: bool
    # The run has ended and nothing will be added after next_offset.
    final: bool = False
    # Asked for (``times=True``): [stream byte offset, epoch ms] marks of this page's bytes, plus the last
    # mark before ``offset`` (so the page's first line has its time). Empty for a runner that records none.
    times: list[list[int]] | None = None


@dataclass
class _Sources:
    count: int
    expected: list[str | None] = field(default_factory=list)
    live_text: bytes | None = None
    live_times: list[list[int]] | None = None
    # The server's own record of a lost runner's log (the flush), not the runner's /done.
    lost: bool = False
    # Set while reading: a chunk the manifest lists was missing or corrupt.
    gaps: bool = False


def _sources(run: Run, index: ChunkIndex) -> _Sources:
    manifest: dict[str, Any] | None = run.log_manifest
    if manifest is not None:
        # The manifest is final: the live record (if one lingers) is ignored.
        lost = "lost" in manifest or "flushed_chunk" in manifest
        return _Sources(count=int(manifest["count"]), expected=list(manifest["sha256"]), lost=lost)
    record = live.get(run.id)
    if record is None and run.status in TERMINAL:
        # The flush may have recorded the manifest and dropped the live record
        # between the read of ``run`` and this one: read the manifest again, or
        # a lost runner's log would read as whole.
        fresh = Run.objects.filter(id=run.id).values_list("log_manifest", flat=True).first()
        if fresh is not None:
            run.log_manifest = fresh
            return _sources(run, index)
    count = record.sealed_chunks if record is not None else index.present_count()
    # A live record outlives its run only when the runner never reached /done
    # (which deletes it): lost, even before the flush has recorded the loss.
    src = _Sources(count=count, lost=record is not None and run.status in TERMINAL)
    if record is not None and record.chunk_index == count:
        # The live snapshot of chunk k is a prefix of sealed chunk k, so offsets
        # into it stay valid once it seals. An unreadable snapshot is skipped:
        # it is a preview, the sealed chunk is the record.
        src.live_text = gunzip(record.data)
        src.live_times = record.times
    return src


def _loader(index: ChunkIndex, n: int) -> Callable[[], bytes]:
    return lambda: index.bytes(n)


def _const(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _times_loader(index: ChunkIndex, n: int) -> Callable[[], list[list[int]] | None]:
    return lambda: decode_times(index.storage.get_times(index.run_id, n))


def _segments(src: _Sources, index: ChunkIndex) -> Iterator[Segment]:
    prev_nl = True

    def marker(line: bytes) -> Segment:
        text = line if prev_nl else b"\n" + line
        return Segment(len(text), True, _const(text))

    for n in range(src.count):
        expected = src.expected[n] if n < len(src.expected) else None
        info = index.info(n)
        if info is None:
            seg = marker(missing_line(n))
            src.gaps = True
        elif info.length is None or (expected is not None and info.sha256 != expected):
            seg = marker(corrupt_line(n))
            src.gaps = True
        else:
            seg = Segment(info.length, info.ends_with_newline, _loader(index, n), _times_loader(index, n))
        prev_nl = seg.ends_with_newline if seg.length else prev_nl
        yield seg
    if src.live_text is not None:
        live_times = src.live_times
        yield Segment(len(src.live_text), src.live_text.endswith(b"\n"), _const(src.live_text), lambda: live_times)
        prev_nl = src.live_text.endswith(b"\n") if src.live_text else prev_nl
    if src.lost:
        yield marker(lost_line())


def _capped(segments: Iterator[Segment], max_bytes: int) -> Iterator[Segment]:
    """The segments cut at ``max_bytes``, followed by the truncation line when anything was cut."""
    pos = 0
    prev_nl = True
    for seg in segments:
        if pos + seg.length <= max_bytes:
            pos += seg.length
            if seg.length:
                prev_nl = seg.ends_with_newline
            yield seg
            continue
        keep = max_bytes - pos
        if keep:
            # Loaded now: the line's length depends on the byte before the cut
            # (only ever on a log over the cap).
            kept = seg.load()[:keep]
            prev_nl = kept.endswith(b"\n")
            yield Segment(keep, prev_nl, _const(kept), seg.marks)
        # The line stands on a line of its own.
        line = truncation_line(max_bytes) if prev_nl else b"\n" + truncation_line(max_bytes)
        yield Segment(len(line), True, _const(line))
        return


def read_log(
    run: Run, *, offset: int, limit: int = PAGE_BYTES, storage: LogStorage | None = None, times: bool = False
) -> LogPage:
    """One page of the run's log from byte ``offset`` (see the module docstring for the stream).

    ``times``: also the time marks of the page's segments, as stream offsets
    (docs/logs.md, "Line times"); one small storage read per sealed chunk the
    page touches, nothing for the live chunk (its marks are in its record).
    """
    terminal = run.status in TERMINAL
    index = ChunkIndex(run.id, storage or get_storage())
    src = _sources(run, index)
    want_end = offset + limit
    out = bytearray()
    pos = 0
    more = False
    marks: list[list[int]] = []
    for seg in _capped(_segments(src, index), conf.get().log_max_bytes):
        start, end = pos, pos + seg.length
        if start >= want_end:
            if seg.length:  # the page is full and the log goes on
                more = True
                break
            continue
        if end > offset and seg.length:
            data = seg.load()
            out += data[max(offset - start, 0) : min(want_end, end) - start]
            if times and seg.marks is not None:
                marks += [[start + at, ms] for at, ms in seg.marks() or () if at < seg.length]
        pos = end
        if pos > want_end:
            more = True
            break
    index.save()
    final = terminal and not more and pos <= want_end
    page_times = _page_times(marks, offset) if times else None
    # Known whole unless the server recorded a lost runner's log (every path that fails an executing run
    # without its runner's /done flushes and flags it) or a listed chunk did not read back.
    whole = not src.lost and not src.gaps
    if final:
        text = out.decode("utf-8", errors="replace")
        return LogPage(text=text, next_offset=max(offset, pos), complete=whole, final=True, times=page_times)
    # More may follow (the next page, or bytes the runner has yet to write):
    # never end inside a character.
    out = out[: len(out) - incomplete_tail(out)]
    if page_times is not None:
        page_times = [m for m in page_times if m[0] < offset + len(out) or m[0] <= offset]
    return LogPage(
        text=out.decode("utf-8", errors="replace"), next_offset=offset + len(out), complete=False, times=page_times
    )


def _page_times(marks: list[list[int]], offset: int) -> list[list[int]]:
    """The marks from ``offset`` on, after the last one before it (the time of the line ``offset`` falls in)."""
    before = [m for m in marks if m[0] < offset]
    return before[-1:] + [m for m in marks if m[0] >= offset]
