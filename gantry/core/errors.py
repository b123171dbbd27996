"""One error tree for the whole service.

Each error carries its machine ``code`` (part of the contract), its HTTP status
and any extra fields; ``gantry.api.errors.exception_handler`` renders them as
``{"code", "detail", ...}``. Services raise these; views never build error
responses by hand.
"""

from __future__ import annotations

import logging
from typing import Any


class GantryError(Exception):
    code = "error"
    http_status = 400
    # Most conflicts are a client arriving too late: worth a warning, not an error.
    log_level = logging.WARNING

    def __init__(self, detail: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.extra = extra

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "detail": self.detail}
        body.update(self.extra)
        return body


class InvalidRequest(GantryError):
    code = "invalid_request"
    http_status = 400


class NotAuthenticated(GantryError):
    code = "not_authenticated"
    http_status = 401


class Forbidden(GantryError):
    code = "forbidden"
    http_status = 403


class NotFound(GantryError):
    code = "not_found"
    http_status = 404


class Conflict(GantryError):
    """A request that the object's current state refuses (HTTP 409)."""

    code = "conflict"
    http_status = 409


class InvalidTransition(Conflict):
    """The run (or deployment) is not in a state this transition starts from."""

    code = "invalid_transition"


class RunTerminal(Conflict):
    """The run has finished; a terminal run never changes again."""

    code = "run_terminal"
