"""Structured logging: one JSON object per line, for the client programs and the server alike.

Every line carries a stable ``event`` key, so an operator greps ``"event":
"worker.exited"`` rather than prose; a record's ``extra`` fields become keys
of their own. The formatter lives here, in the shared package and stdlib
only, so a runner or a launcher never loads server code (importing anything
under ``gantry`` loads Django's settings and the Celery app: about 0.15 s on
every runner start); the server's logging settings name it here too.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

TYPE_CHECKING = False  # typing stays out of a runner's start-up (docs/runners.md)
if TYPE_CHECKING:
    from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(log: logging.Logger, name: str, msg: str, *args: Any, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``msg`` with ``event=name`` and ``fields`` as keys of their own."""
    log.log(level, msg, *args, extra={"event": name, **fields})
