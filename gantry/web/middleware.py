"""Request-level guards that must run before anything reads the body."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from gantry.core.errors import BodyTooLarge

log = logging.getLogger("gantry.api")


class BodyLimitMiddleware:
    """A body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is answered 413 in JSON, by its Content-Length, unread.

    Left to Django, reading such a body raises RequestDataTooBig, which answers
    an HTML "Bad Request (400)" and logs a traceback at ERROR: the wrong status,
    the wrong format, and noise for what is only a client's mistake. A body
    without Content-Length (chunked) is bounded by the JSON parser instead.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit:
            err = BodyTooLarge(f"the request body is {length} bytes; the limit is {limit}")
            log.warning("request refused: %s", err.detail,
                        extra={"event": "api.refused", "code": err.code, "path": request.path})  # fmt: skip
            return JsonResponse(err.as_dict(), status=err.http_status)
        return self.get_response(request)
