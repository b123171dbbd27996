"""The sealed-chunk manifest a runner reports on /done (``{count, sha256: [hex, ...]}``), kept on ``run.log_manifest``.

It is part of the run row (the reader trusts it for which chunks a log has),
so its rule lives with the state machine; the logs app reads it from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gantry.core.errors import InvalidRequest

# Chunk numbers run 0..MAX_CHUNKS-1. A chunk seals at 1 MiB or 30 s, so this is
# 32 GiB of output or eleven days of a trickle, far past GANTRY_LOG_MAX_BYTES
# and the longest spec timeout (7 days); it also bounds the manifest kept on
# the run row (~2 MB of hashes at worst).
MAX_CHUNKS = 32768

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and _HEX64.match(value.lower()) is not None


def normalize_manifest(manifest: Mapping[str, Any], *, sealed_chunks: int | None) -> dict[str, Any]:
    """Check a runner's manifest and answer the form kept on the run (lowercase hashes).

    The count, the list and ``sealed_chunks`` (when given) must agree: the
    reader trusts the manifest to say which chunks the log has, so a
    self-contradicting one is refused rather than half-believed.
    """
    count = manifest.get("count")
    hashes = manifest.get("sha256")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_CHUNKS:
        raise InvalidRequest(f"manifest.count must be a whole number from 0 to {MAX_CHUNKS}")
    if not isinstance(hashes, list) or not all(is_sha256(h) for h in hashes):
        raise InvalidRequest("manifest.sha256 must be a list of hex sha256 digests (64 characters)")
    if len(hashes) != count:
        raise InvalidRequest(f"manifest.count is {count} but manifest.sha256 lists {len(hashes)} hashes")
    if sealed_chunks is not None and sealed_chunks != count:
        raise InvalidRequest(f"sealed_chunks is {sealed_chunks} but the manifest counts {count} chunks")
    return {"count": count, "sha256": [h.lower() for h in hashes]}
