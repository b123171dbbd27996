"""A flush that runs every few seconds on a daemon thread of its own, and once more at exit.

For work a hot path hands off to be done in bulk a moment later (the run
figures of gantry.metrics, the live-log records gantry.logs.live drops after
/done): one thread per process, started by the first hand-off, so a process
forked after import (a gunicorn worker) starts its own (threads do not
survive fork).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("gantry")


class Ticker:
    """Calls ``flush`` every ``seconds`` once :meth:`start` was called, and at exit (its errors are logged)."""

    def __init__(self, name: str, seconds: float, flush: Callable[[], None]) -> None:
        self.name, self.seconds, self.flush = name, seconds, flush
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        atexit.register(flush)

    def start(self) -> None:
        """Make sure this process's thread runs (cheap when it does)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.seconds)
            try:
                self.flush()
            except Exception:  # never let the thread die: the next hand-off needs it
                log.exception("%s failed", self.name)
