"""The runner's log buffer and shipper (docs/logs.md), without a server: a recording fake client."""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
import time
from typing import Any

import pytest
import time_machine

from gantry_wire.protocol import TIME_MARKS_MAX, truncation_line
from runners.client import ApiError, ServerUnreachable, Upload
from runners.logbuf import LogBuffer, LogShipper, gzip_bytes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(buf: LogBuffer) -> list[tuple[int, bytes]]:
    out = []
    while (item := buf.next_sealed(timeout=0)) is not None:
        out.append(item)
    return out


def test_it_seals_exactly_at_the_chunk_size_in_order() -> None:
    buf = LogBuffer(chunk_size=10, seal_interval=30, max_bytes=10_000)
    buf.write(b"0123456789abcdefghij-klm")
    buf.write(b"nopqr")

    sealed = drain(buf)
    assert sealed == [(0, b"0123456789"), (1, b"abcdefghij")]
    assert buf.snapshot() == (2, b"-klmnopqr")
    buf.close()
    assert drain(buf) == [(2, b"-klmnopqr")]
    assert buf.drained()
    assert buf.sealed_count == 3


def test_it_seals_a_chunk_that_is_old_enough() -> None:
    clock = Clock()
    buf = LogBuffer(chunk_size=1000, seal_interval=30, max_bytes=10_000, clock=clock)
    assert not buf.seal_if_due()  # empty: nothing to seal, however long
    buf.write(b"a trickle\n")
    clock.now = 29.9
    assert not buf.seal_if_due()
    clock.now = 30.0
    assert buf.seal_if_due()
    assert drain(buf) == [(0, b"a trickle\n")]
    # The next chunk's age counts from its own first byte.
    clock.now = 100.0
    buf.write(b"more\n")
    clock.now = 120.0
    assert not buf.seal_if_due()


def test_the_live_snapshot_is_a_prefix_of_the_sealed_chunk() -> None:
    buf = LogBuffer(chunk_size=8, seal_interval=30, max_bytes=10_000)
    buf.write(b"abc")
    index, live = buf.snapshot()
    buf.write(b"defghij")
    ((sealed_index, sealed),) = drain(buf)
    assert (index, sealed_index) == (0, 0)
    assert sealed.startswith(live)


def test_it_stops_recording_past_max_bytes_with_a_truncation_line() -> None:
    marker = truncation_line(200)
    buf = LogBuffer(chunk_size=64, seal_interval=30, max_bytes=200)
    buf.write(b"x" * 100)
    buf.write(b"y" * 100)
    buf.write(b"z" * 1000)  # still drained, never recorded
    buf.close()

    text = b"".join(data for _, data in drain(buf))
    assert len(text) == 200  # never over the limit, marker included
    assert text == b"x" * 100 + b"y" * (100 - len(marker) - 1) + b"\n" + marker
    assert buf.truncated
    assert buf.dropped == 1000 + len(marker) + 1
    assert b"log truncated at 200 bytes" in marker


def test_writes_block_while_too_many_chunks_wait_for_upload() -> None:
    buf = LogBuffer(chunk_size=4, seal_interval=30, max_bytes=10_000, max_pending=2)
    writer = threading.Thread(target=buf.write, args=(b"x" * 40,))
    writer.start()
    writer.join(0.3)
    assert writer.is_alive(), "the writer should wait for the uploader"
    taken = []
    while writer.is_alive() or (item := buf.next_sealed(timeout=0)) is not None:
        item = buf.next_sealed(timeout=0.1)
        if item:
            taken.append(item[0])
    taken += [i for i, _ in drain(buf)]
    assert taken == list(range(10))


def test_it_takes_50_mib_in_pipe_sized_blocks_whole_and_in_order() -> None:
    """Its speed is a benchmark figure (tests/bench/logbuf.py), not an assertion here."""
    buf = LogBuffer(chunk_size=1 << 20, seal_interval=30, max_bytes=256 << 20, max_pending=1000)
    block = b"".join(b"%07d\n" % i for i in range(8192))  # 64 KiB, the size of a pipe read
    for _ in range(800):
        buf.write(block)
    buf.close()
    chunks = drain(buf)
    assert sum(len(c) for _, c in chunks) == 800 * len(block)
    assert [i for i, _ in chunks] == list(range(len(chunks)))
    assert b"".join(c for _, c in chunks) == block * 800
    assert all(len(c) <= 1 << 20 for _, c in chunks)


class FakeClient:
    """Records chunk handouts, PUTs and live pushes; fails the first PUTs of chosen chunks."""

    def __init__(self, flaky: dict[int, int] | None = None) -> None:
        self.flaky = dict(flaky or {})
        self.puts: list[tuple[int, bytes]] = []
        self.handouts: list[tuple[int, str, int]] = []
        self.times: dict[int, list[list[int]] | None] = {}
        self.live: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def chunk_upload(
        self, run_id: str, index: int, *, sha256: str, size: int, times: list[list[int]] | None = None
    ) -> Upload:
        with self.lock:
            self.handouts.append((index, sha256, size))
            self.times[index] = times
        return Upload(url=f"/upload/{index}")

    def put_chunk(self, upload: Upload, data: bytes, retry: Any = None) -> None:
        index = int(upload.url.rsplit("/", 1)[1])
        with self.lock:
            if self.flaky.get(index, 0) > 0:
                self.flaky[index] -= 1
                raise ServerUnreachable("connection reset")
            self.puts.append((index, data))

    def live_push(
        self, run_id: str, *, chunk_index: int, sealed_chunks: int, data: str, times: list[list[int]] | None = None
    ) -> None:
        with self.lock:
            self.live.append({"chunk_index": chunk_index, "sealed_chunks": sealed_chunks, "data": data, "times": times})


def test_the_shipper_uploads_each_chunk_once_with_identical_bytes_on_retry() -> None:
    client = FakeClient(flaky={1: 2})
    buf = LogBuffer(chunk_size=100, seal_interval=30, max_bytes=1 << 20)
    shipper = LogShipper(client, "run-1", buf, live_interval=60)  # type: ignore[arg-type]
    shipper.start()
    payload = b"".join(b"line %04d\n" % i for i in range(100))  # 1000 bytes: 10 chunks
    buf.write(payload)
    manifest = shipper.finish(timeout=60)

    assert manifest.count == 10
    assert manifest.uploaded == 10
    assert [i for i, _ in client.puts] == list(range(10))  # each exactly once, in order
    assert b"".join(gzip.decompress(d) for _, d in client.puts) == payload
    assert manifest.sha256 == [hashlib.sha256(d).hexdigest() for _, d in client.puts]
    # Chunk 1 was handed out three times (two failed PUTs), always with the same digest.
    assert {h for i, h, _ in client.handouts if i == 1} == {manifest.sha256[1]}
    assert sum(1 for i, _, _ in client.handouts if i == 1) == 3


def test_the_live_tick_pushes_the_active_chunk_and_skips_unchanged_ticks() -> None:
    client = FakeClient()
    buf = LogBuffer(chunk_size=1000, seal_interval=30, max_bytes=1 << 20)
    shipper = LogShipper(client, "run-1", buf, live_interval=0.05)  # type: ignore[arg-type]
    shipper.start()
    time.sleep(0.3)
    assert client.live == []  # nothing written: nothing pushed
    buf.write(b"hello\n")
    deadline = time.monotonic() + 5
    while not client.live and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # several more ticks, all unchanged
    shipper.finish()

    assert len(client.live) == 1
    push = client.live[0]
    assert (push["chunk_index"], push["sealed_chunks"]) == (0, 0)
    assert gzip.decompress(base64.b64decode(push["data"])) == b"hello\n"


def test_a_chunk_the_server_refuses_is_given_up_but_stays_in_the_manifest() -> None:
    class Refusing(FakeClient):
        def chunk_upload(
            self, run_id: str, index: int, *, sha256: str, size: int, times: list[list[int]] | None = None
        ) -> Upload:
            if index == 0:
                raise ApiError(409, "run_terminal", "run is failure")
            return super().chunk_upload(run_id, index, sha256=sha256, size=size, times=times)

    client = Refusing()
    buf = LogBuffer(chunk_size=4, seal_interval=30, max_bytes=1 << 20)
    shipper = LogShipper(client, "run-1", buf, live_interval=60)  # type: ignore[arg-type]
    shipper.start()
    buf.write(b"aaaabbbb")
    manifest = shipper.finish()
    assert manifest.count == 2
    assert manifest.uploaded == 0  # chunk 0 missing: nothing stored without a gap
    assert shipper.failed_chunks == [0]
    assert manifest.sha256[0] == hashlib.sha256(gzip_bytes(b"aaaa")).hexdigest()


@pytest.mark.parametrize("size", [0, 1, 1000])
def test_gzip_is_the_same_bytes_whenever_it_is_made(size: int) -> None:
    """A retried PUT must carry the first one's bytes (same sha256): no timestamp in the gzip header."""
    data = b"x" * size
    with time_machine.travel("2026-01-01 00:00:00", tick=False):
        first = gzip_bytes(data)
    with time_machine.travel("2031-06-15 12:34:56", tick=False):
        later = gzip_bytes(data)
    assert first == later
    assert first[4:8] == b"\0\0\0\0"  # MTIME, RFC 1952
    assert gzip.decompress(first) == data


def test_when_storage_stays_down_finish_still_names_every_chunk_in_the_manifest() -> None:
    client = FakeClient(flaky={0: 10**6, 1: 10**6, 2: 10**6})  # every PUT fails, for ever
    buf = LogBuffer(chunk_size=4, seal_interval=30, max_bytes=1 << 20)
    shipper = LogShipper(client, "run-1", buf, live_interval=60, upload_deadline=3600)  # type: ignore[arg-type]
    shipper.start()
    buf.write(b"aaaabbbbcc")
    manifest = shipper.finish(timeout=0.5)  # gives up rather than retrying for the hour's upload deadline

    assert manifest.count == 3
    assert manifest.uploaded == 0
    assert manifest.sha256 == [hashlib.sha256(gzip_bytes(c)).hexdigest() for c in (b"aaaa", b"bbbb", b"cc")]
    assert client.puts == []


# ---------------------------------------------------------------- line times


class WallClock:
    """A wall clock the test moves by hand (epoch seconds)."""

    def __init__(self, at: float = 1_700_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def test_it_marks_when_each_block_was_written_beside_the_chunk_not_in_it() -> None:
    wall = WallClock()
    buf = LogBuffer(chunk_size=20, seal_interval=30, max_bytes=1 << 20, wall=wall)
    buf.write(b"one\n")  # a chunk begins: a mark at 0
    wall.at += 0.05
    buf.write(b"two\n")  # 50 ms later: too soon for a mark of its own
    wall.at += 2
    buf.write(b"three\n")  # 2 s later: a mark at its first byte
    index, data, marks = buf.live_snapshot()
    assert (index, data) == (0, b"one\ntwo\nthree\n")  # the bytes are the log's own, untouched
    assert marks == [[0, 1_700_000_000_000], [8, 1_700_000_002_050]]
    wall.at += 1
    buf.write(b"four\nfive\n")  # fills chunk 0 at 20 bytes; the rest opens chunk 1 with its own mark
    assert buf.take_marks(0) == [[0, 1_700_000_000_000], [8, 1_700_000_002_050], [14, 1_700_000_003_050]]
    assert buf.take_marks(0) == []  # handed over once
    assert buf.live_snapshot()[2] == [[0, 1_700_000_003_050]]


def test_it_caps_the_marks_of_one_chunk() -> None:
    wall = WallClock()
    buf = LogBuffer(chunk_size=1 << 20, seal_interval=30, max_bytes=1 << 20, wall=wall)
    for _ in range(TIME_MARKS_MAX + 50):
        wall.at += 1
        buf.write(b"x\n")
    marks = buf.live_snapshot()[2]
    assert len(marks) == TIME_MARKS_MAX
    assert [m[0] for m in marks] == [2 * i for i in range(TIME_MARKS_MAX)]


def test_the_shipper_sends_each_chunks_marks_with_its_handout_and_the_live_push() -> None:
    client = FakeClient()
    wall = WallClock()
    buf = LogBuffer(chunk_size=10, seal_interval=30, max_bytes=1 << 20, wall=wall)
    shipper = LogShipper(client, "run-1", buf, live_interval=0.05)  # type: ignore[arg-type]
    shipper.start()
    buf.write(b"12345678\n")
    wall.at += 1
    buf.write(b"abc\n")  # 13 bytes: chunk 0 seals at 10, chunk 1 holds "bc\n"
    deadline = time.monotonic() + 5
    while not client.live and time.monotonic() < deadline:
        time.sleep(0.01)
    shipper.finish()
    assert client.times[0] == [[0, 1_700_000_000_000], [9, 1_700_000_001_000]]
    assert client.times[1] == [[0, 1_700_000_001_000]]
    assert client.live[0]["times"] == [[0, 1_700_000_001_000]]
