"""The fixed sizes of the log contract (docs/logs.md), written once.

``CHUNK_SIZE`` and ``SEAL_INTERVAL`` are the runner protocol's
(``gantry_wire.protocol``): RunContext hands them to the runner as
``logs.chunk_size_bytes`` and ``logs.seal_interval_s``.
"""

from __future__ import annotations

from gantry.core.manifest import MAX_CHUNKS
from gantry_wire.protocol import CHUNK_SIZE, SEAL_INTERVAL, TIME_MARKS_MAX

__all__ = [
    "CHUNK_GZIP_MAX",
    "CHUNK_SIZE",
    "CHUNK_TEXT_MAX",
    "MAX_CHUNKS",
    "PAGE_BYTES",
    "SEAL_INTERVAL",
    "TIME_MARKS_MAX",
    "UPLOAD_URL_TTL",
]

# A gzip of CHUNK_SIZE bytes is at most a little over CHUNK_SIZE (incompressible
# output plus headers); twice that leaves room for a runner that seals a line
# past the threshold, and still bounds what one request may make us hold.
CHUNK_GZIP_MAX = 2 * CHUNK_SIZE
# Decompressed size past which a chunk is treated as corrupt: a 2 MiB gzip can
# expand to gigabytes, and the reader must never do that.
CHUNK_TEXT_MAX = 16 * CHUNK_SIZE
# Most log bytes one GET /runs/{id}/logs answers; a longer log is read in pages.
PAGE_BYTES = 1024 * 1024
# How long a handed-out upload URL (S3 or Gantry's own) stays valid.
UPLOAD_URL_TTL = 900
