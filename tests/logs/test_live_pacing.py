"""The runner's live push pacing (runners/logbuf.py, docs/logs.md "Live push").

The first output goes at once; later output is coalesced so two pushes are at
least ``live_gap`` apart (0.2 s, more for a big snapshot: a byte budget a
second); an unchanged snapshot is never pushed again; the last output is
pushed without waiting for a tick. A fake client records the pushes and when
they were made (it stands in for the server: the shipper's own logic is
under test).
"""

from __future__ import annotations

import base64
import gzip
import itertools
import time
from typing import Any

import pytest

from runners.logbuf import LIVE_BATCH_S, LIVE_BYTES_PER_S, LogBuffer, LogShipper, live_gap
from tests.runners.test_logbuf import FakeClient


class TimedClient(FakeClient):
    """Records each push's moment (the shipper's clock) beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def live_push(self, run_id: str, **push: Any) -> None:
        with self.lock:
            self.at.append(time.monotonic())
        super().live_push(run_id, **push)


def shipping(client: TimedClient) -> tuple[LogBuffer, LogShipper]:
    """A started shipper (a 1 MiB chunk, the interval far longer than any test: only the pacing pushes)."""
    buf = LogBuffer(chunk_size=1 << 20, seal_interval=30, max_bytes=4 << 20)
    shipper = LogShipper(client, "run-1", buf, live_interval=60)  # type: ignore[arg-type]
    shipper.start()
    return buf, shipper


def text_of(push: dict[str, Any]) -> bytes:
    return gzip.decompress(base64.b64decode(push["data"]))


def settle(client: TimedClient, seconds: float = 0.6) -> int:
    """Waits until no push came for ``seconds`` (longer than any gap here); answers the push count."""
    count = -1
    while count != len(client.live):
        count = len(client.live)
        time.sleep(seconds)
    return count


def test_the_gap_is_the_batch_window_grows_with_the_snapshot_and_never_passes_the_interval() -> None:
    assert live_gap(0, 2) == live_gap(10_000, 2) == LIVE_BATCH_S
    assert live_gap(LIVE_BYTES_PER_S, 2) == pytest.approx(1.0)  # 512 KiB: one push a second
    assert live_gap(1 << 20, 2) == pytest.approx(2.0)  # a full 1 MiB chunk: the old tick's rate
    assert live_gap(2 << 20, 2) == 2.0  # GANTRY_LIVE_LOG_INTERVAL is the longest a line waits
    assert live_gap(0, 0.05) == LIVE_BATCH_S  # never more than 1 / LIVE_BATCH_S pushes a second
    for size in (0, 100_000, 300_000, 1 << 20):  # bytes a second stay within the budget (or the old tick's)
        assert size / live_gap(size, 2) <= max(LIVE_BYTES_PER_S, size / 2)


def test_the_first_output_is_pushed_at_once_not_after_an_interval() -> None:
    client = TimedClient()
    buf, shipper = shipping(client)
    try:
        time.sleep(0.3)
        assert client.live == []  # nothing written: nothing pushed
        buf.write(b"hello\n")
        deadline = time.monotonic() + 30  # hang guard, far below the 60 s interval the old tick waited
        while not client.live:
            assert time.monotonic() < deadline, "the first output was not pushed"
            time.sleep(0.01)
        assert text_of(client.live[0]) == b"hello\n"
    finally:
        shipper.finish()


def test_steady_output_is_coalesced_deduped_and_its_end_is_pushed() -> None:
    client = TimedClient()
    buf, shipper = shipping(client)
    written = b""
    try:
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < 1.5:  # a line every 10 ms
            line = b"line %d\n" % i
            buf.write(line)
            written += line
            i += 1
            time.sleep(0.01)
        count = settle(client)
        time.sleep(0.5)
        assert len(client.live) == count  # quiet: unchanged snapshots are not pushed
    finally:
        shipper.finish()

    assert text_of(client.live[-1]) == written  # the last line went out without waiting for a tick
    gaps = [b - a for a, b in zip(client.at, client.at[1:], strict=False)]
    assert all(g >= LIVE_BATCH_S - 0.02 for g in gaps), gaps  # coalesced: at most 5 pushes a second
    assert 3 <= len(client.live) < i  # pushed as it went, and far fewer pushes than lines
    texts = [text_of(p) for p in client.live]
    assert all(a != b and b.startswith(a) for a, b in itertools.pairwise(texts))  # each grew: no repeat


def test_a_big_active_chunk_is_pushed_within_the_byte_budget() -> None:
    client = TimedClient()
    buf, shipper = shipping(client)
    try:
        buf.write(b"x" * 400_000 + b"\n")  # 400 KB: the gap grows to about 0.8 s
        started = time.monotonic()
        while time.monotonic() - started < 3:
            buf.write(b"more\n")
            time.sleep(0.02)
        settle(client, 1.2)
    finally:
        shipper.finish()

    sizes = [len(text_of(p)) for p in client.live]
    assert len(sizes) >= 3  # pushes while it grew, not one at the end
    for (a, b), size in zip(zip(client.at, client.at[1:], strict=False), sizes[1:], strict=False):
        assert b - a >= live_gap(size, 60) - 0.02, (b - a, size)
    pushed = sum(sizes[1:])
    assert pushed / (client.at[-1] - client.at[0]) <= LIVE_BYTES_PER_S * 1.05  # bytes a second under the budget
