"""Run logs: live records in Redis, sealed chunks in storage, and the reader (docs/logs.md).

``flush_live_log`` (one run) and ``flush_live_logs`` (a batch) are what the
reapers and the other lost-runner paths call after they failed a run whose
runner went away. They are thin wrappers so that importing this package
(which Django does while it loads apps, before models are ready) pulls in no
models.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gantry.logs.services import Flushed, PendingFlush


def flush_live_log(run_id: uuid.UUID) -> bool:
    """Persist the run's last live snapshot as its final chunk; see ``gantry.logs.services``."""
    from gantry.logs.services import flush_live_log as flush

    return flush(run_id)


def flush_live_logs(run_ids: Sequence[uuid.UUID]) -> Flushed:
    """``flush_live_log`` for many runs at once; see ``gantry.logs.services``."""
    from gantry.logs.services import flush_live_logs as flush

    return flush(list(run_ids))


def start_flush(run_ids: Sequence[uuid.UUID]) -> PendingFlush:
    """``flush_live_logs`` in two halves: the storage writes start now, ``.finish()`` records them."""
    from gantry.logs.services import start_flush as start

    return start(list(run_ids))


__all__ = ["flush_live_log", "flush_live_logs", "start_flush"]
