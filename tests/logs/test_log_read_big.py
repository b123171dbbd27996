"""A 50 MB log, sealed as ~50 chunks of 1 MiB, comes back through the API complete and in order."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from gantry.logs.limits import CHUNK_SIZE, PAGE_BYTES

from .conftest import Executing

LOG_BYTES = 50 * 1000 * 1000


def _numbered_lines() -> bytes:
    # A multi-byte character on every line, so chunk and page boundaries fall inside characters too.
    line_bytes = len(f"{0:08d} é numbered line of the big log\n".encode())
    lines = LOG_BYTES // line_bytes
    return "".join(f"{i:08d} é numbered line of the big log\n" for i in range(lines)).encode()


@pytest.mark.slow
def test_it_pages_through_a_50_mb_log(executing: Executing, teammate_api: APIClient) -> None:
    raw = _numbered_lines()
    # The runner's cut: every CHUNK_SIZE bytes, wherever that falls.
    chunks = [raw[i : i + CHUNK_SIZE] for i in range(0, len(raw), CHUNK_SIZE)]
    assert len(chunks) >= 47
    hashes = executing.seal(chunks)
    assert executing.done(hashes).status_code == 204

    timings = []
    for attempt in ("cold", "warm"):
        started = time.perf_counter()
        offset, pages, parts = 0, 0, []
        while True:
            answer = teammate_api.get(f"/api/v1/runs/{executing.run.id}/logs", {"offset": offset})
            assert answer.status_code == 200
            page = answer.json()
            pages += 1
            assert len(page["text"].encode()) <= PAGE_BYTES
            parts.append(page["text"])
            if page["complete"]:
                break
            assert page["next_offset"] > offset
            offset = page["next_offset"]
        timings.append(time.perf_counter() - started)
        text = "".join(parts)
        assert offset == len(raw) or page["next_offset"] == len(raw)
        assert text.encode() == raw, f"{attempt} read differs from the log"
    lines = text.splitlines()
    assert [int(line[:8]) for line in lines[:: len(lines) // 1000]] == list(range(0, len(lines), len(lines) // 1000))
    print(
        f"\n50 MB log: {len(raw):,} bytes in {len(chunks)} chunks, read in {pages} pages; "
        f"cold {timings[0]:.2f} s, warm {timings[1]:.2f} s"
    )
