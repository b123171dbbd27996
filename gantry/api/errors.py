"""The one place errors become HTTP answers: ``{"code": ..., "detail": ...}``."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response

from gantry.core.errors import GantryError

log = logging.getLogger("gantry.api")

# DRF's own exceptions, mapped onto the contract's codes.
_DRF_CODES: dict[type[drf.APIException], str] = {
    drf.NotAuthenticated: "not_authenticated",
    drf.AuthenticationFailed: "authentication_failed",
    drf.PermissionDenied: "forbidden",
    drf.NotFound: "not_found",
    drf.MethodNotAllowed: "method_not_allowed",
    drf.NotAcceptable: "not_acceptable",
    drf.UnsupportedMediaType: "unsupported_media_type",
    drf.ParseError: "invalid_json",
    drf.ValidationError: "invalid_request",
    drf.Throttled: "throttled",
}


def _flatten(detail: Any) -> str:
    """A readable one-line summary of DRF's nested validation errors."""
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_flatten(value)}" for key, value in detail.items())
    if isinstance(detail, list):
        return " ".join(_flatten(item) for item in detail)
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, GantryError):
        request = context.get("request")
        log.log(
            exc.log_level,
            "request refused: %s",
            exc.detail,
            extra={"event": "api.refused", "code": exc.code, "path": getattr(request, "path", None)},
        )
        return Response(exc.as_dict(), status=exc.http_status)
    if isinstance(exc, Http404):
        exc = drf.NotFound("not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied()
    if not isinstance(exc, drf.APIException):
        return None  # a bug: let Django answer 500 and log the traceback
    code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "error")
    body: dict[str, Any] = {"code": code, "detail": _flatten(exc.detail)}
    if isinstance(exc, drf.ValidationError) and isinstance(exc.detail, dict):
        body["fields"] = exc.detail
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    wait = getattr(exc, "wait", None)
    if isinstance(exc, drf.Throttled) and wait is not None:
        headers["Retry-After"] = str(int(wait))
    return Response(body, status=exc.status_code, headers=headers)
