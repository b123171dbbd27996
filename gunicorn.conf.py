"""gunicorn's settings file: read from the working directory, gunicorn's default ``--config``.

Only hooks live here; bind address, worker class and threads stay on the
command line (README, Dockerfile, dev.py).
"""

from __future__ import annotations

import signal
from typing import Any


def post_worker_init(worker: Any) -> None:
    """On SIGTERM, wake the worker's parked long polls before gunicorn drains its requests.

    Without this a graceful stop waits for every parked ``?wait=`` poll to time
    out (up to GANTRY_POLL_MAX_WAIT seconds) or for the graceful timeout to cut
    it. The worker has set its own SIGTERM handler by now; it still runs.
    """
    if type(worker).__module__.startswith("uvicorn"):
        # Under uvicorn's worker, gantry.asgi chains its own handler at startup
        # (uvicorn replaces any handler set here for as long as it serves).
        return
    from gantry.dispatch import longpoll

    longpoll.shutdown_on(signal.SIGTERM)
