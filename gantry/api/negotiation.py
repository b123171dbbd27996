"""Content negotiation that answers the common case without parsing: no Accept, or ``*/*``.

A runner sends no Accept header (or ``*/*``) on every call, and DRF parsed it
into media types and ranked them against the renderers each time. For those
two forms, and for exactly the first renderer's media type, the answer is
what DRF's own negotiation gives; anything else (another Accept, a
``?format=``, a format suffix) goes to DRF's negotiation unchanged, 406
included.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request


class FastContentNegotiation(DefaultContentNegotiation):
    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: Any = None
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)
        if renderers and not format_suffix and self.settings.URL_FORMAT_OVERRIDE not in request.query_params:
            accept = request.META.get("HTTP_ACCEPT")
            first = renderers[0]
            # DRF answers */* with the first renderer and its own media type.
            if accept is None or accept == "*/*":
                return first, first.media_type
            if accept == first.media_type:
                return first, accept
        return super().select_renderer(request, renderers, format_suffix)
