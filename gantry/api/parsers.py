"""The API's JSON parser: bounded, and refusing what the database cannot store, before any view runs.

DRF's own parser hands a view whatever ``json.loads`` makes of the body. Here
:func:`strict_json` judges every JSON body, for DRF's parser and for the fast
lane (gantry.server.lane) alike: at most the body limit, UTF-8, JSON without
NaN or Infinity, a 400 for a body nested so deep that the decoder gives up,
and :mod:`gantry.core.jsonsafe` over the result (a NUL or a lone surrogate
anywhere, or nesting past its limit, is a 400 naming where).
"""

from __future__ import annotations

import json
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from gantry.core import jsonsafe
from gantry.core.errors import BodyTooLarge, InvalidRequest


def strict_json(raw: bytes) -> Any:
    """The body's JSON value; raises BodyTooLarge (413), ParseError (400, not JSON) or InvalidRequest (400).

    The one judgement of a JSON body: StrictJSONParser answers its errors, and
    the fast lane hands a body it refuses to Django, whose parser then answers
    the same error.
    """
    limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if len(raw) > limit:
        raise BodyTooLarge(f"the request body is over {limit} bytes")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except RecursionError:
        raise InvalidRequest(f"the body is nested more than {jsonsafe.MAX_DEPTH} levels deep") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ParseError(f"JSON parse error - {exc}") from None
    why = jsonsafe.problem(data)
    if why is not None:
        raise InvalidRequest(why)
    return data


class StrictJSONParser(JSONParser):
    def parse(self, stream: IO[bytes], media_type: str | None = None, parser_context: Any = None) -> Any:
        # At most one byte past the limit: a chunked body has no Content-Length
        # for BodyLimitMiddleware to judge.
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        return strict_json(stream.read(limit + 1) if stream is not None else b"")


def _no_constants(name: str) -> Any:
    # NaN and Infinity are not JSON (DRF's strict parser refuses them too).
    raise ValueError(f"{name} is not valid JSON")
