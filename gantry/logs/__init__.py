"""Run logs: live records in Redis, sealed chunks in storage, and the reader (docs/logs.md).

``flush_live_log`` is the seam the inactive-runner reaper calls after it has
failed a run whose runner went silent. It is a thin wrapper so that importing
this package (which Django does while it loads apps, before models are ready)
pulls in no models.
"""

from __future__ import annotations

import uuid


def flush_live_log(run_id: uuid.UUID) -> bool:
    """Persist the run's last live snapshot as its final chunk; see ``gantry.logs.services``."""
    from gantry.logs.services import flush_live_log as flush

    return flush(run_id)


__all__ = ["flush_live_log"]
