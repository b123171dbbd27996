"""Structured logging for the client programs: one JSON object per line on stderr.

The same shape as the server's (``gantry.logging``, stdlib only): every line
carries a stable ``event`` key, so an operator greps ``"event": "worker.exited"``
rather than prose.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from gantry.logging import JsonFormatter


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(log: logging.Logger, name: str, msg: str, *args: Any, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``msg`` with ``event=name`` and ``fields`` as keys of their own."""
    log.log(level, msg, *args, extra={"event": name, **fields})
