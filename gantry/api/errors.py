"""The one place errors become HTTP answers: ``{"code": ..., "detail": ...}``.

Gantry's own errors carry their code, status and headers
(``gantry.core.errors``). DRF's exceptions (bad JSON, a missing credential, a
wrong method, its validation errors) are mapped onto those classes here, so
the codes a client can meet are exactly the registry's.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response

from gantry.core import errors

log = logging.getLogger("gantry.api")

# DRF's own exceptions, as the registry's classes (most specific first).
_FROM_DRF: tuple[tuple[type[drf.APIException], type[errors.GantryError]], ...] = (
    (drf.NotAuthenticated, errors.NotAuthenticated),
    (drf.AuthenticationFailed, errors.AuthenticationFailed),
    (drf.PermissionDenied, errors.Forbidden),
    (drf.NotFound, errors.NotFound),
    (drf.MethodNotAllowed, errors.MethodNotAllowed),
    (drf.NotAcceptable, errors.NotAcceptable),
    (drf.UnsupportedMediaType, errors.UnsupportedMediaType),
    (drf.ParseError, errors.InvalidJson),
    (drf.ValidationError, errors.InvalidRequest),
)


def _flatten(detail: Any) -> str:
    """A readable one-line summary of DRF's nested validation errors."""
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(item) for item in detail)
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, errors.GantryError):
        request = context.get("request")
        log.log(
            exc.log_level,
            "request refused: %s",
            exc.detail,
            extra={"event": "api.refused", "code": exc.code, "path": getattr(request, "path", None)},
        )
        return Response(exc.as_dict(), status=exc.http_status, headers=exc.headers())
    if isinstance(exc, errors.DATABASE_UNAVAILABLE):
        # The database is down or restarting: a client can retry, and a 500
        # (with a traceback in the log) would say the server is broken.
        log.warning("database unavailable: %s", exc, extra={"event": "api.database_unavailable"})
        exc = errors.ServiceUnavailable("the database is not answering; try again shortly", retry_after=1)
        return Response(exc.as_dict(), status=exc.http_status, headers=exc.headers())
    if isinstance(exc, Http404):
        exc = drf.NotFound("not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied()
    if not isinstance(exc, drf.APIException):
        return None  # a bug: let Django answer 500 and log the traceback
    cls = next((ours for theirs, ours in _FROM_DRF if isinstance(exc, theirs)), None)
    code = cls.code if cls is not None else errors.GantryError.code
    body: dict[str, Any] = {"code": code, "detail": _flatten(exc.detail)}
    if isinstance(exc, drf.ValidationError) and isinstance(exc.detail, dict):
        body["fields"] = exc.detail
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    return Response(body, status=exc.status_code, headers=headers)
