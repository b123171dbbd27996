"""How fast the runner's LogBuffer takes a step's output: 50 MiB in pipe-sized blocks.

    .venv/bin/python -m tests.bench.logbuf

Prints milliseconds per run (median of 5) and the throughput; no database needed.
"""

from __future__ import annotations

import statistics
import time

from runners.logbuf import LogBuffer

BLOCK = b"".join(b"%07d\n" % i for i in range(8192))  # 64 KiB, the size of a pipe read
BLOCKS = 800  # 50 MiB


def once() -> float:
    buf = LogBuffer(chunk_size=1 << 20, seal_interval=30, max_bytes=256 << 20, max_pending=1000)
    started = time.perf_counter()
    for _ in range(BLOCKS):
        buf.write(BLOCK)
    seconds = time.perf_counter() - started
    buf.close()
    return seconds


def main() -> None:
    runs = sorted(once() for _ in range(5))
    median = statistics.median(runs)
    mib = BLOCKS * len(BLOCK) / (1 << 20)
    print(f"LogBuffer.write: {mib:.0f} MiB in {median * 1000:.1f} ms median (min {runs[0] * 1000:.1f}, "
          f"max {runs[-1] * 1000:.1f}); {mib / median:.0f} MiB/s")  # fmt: skip


if __name__ == "__main__":
    main()
