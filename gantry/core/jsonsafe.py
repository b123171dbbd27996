"""What PostgreSQL (and a shell) can store and hand back: the one check for JSON from outside.

``jsonb`` refuses the NUL character (``\\u0000``), and a lone UTF-16 surrogate
(``\\ud800``) cannot be encoded as UTF-8 at all; either used to reach the
database and fail there as a 500. Deep nesting is refused too: nothing Gantry
stores is deeper than a few levels, and a deep structure only costs recursion.
The API's JSON parser (``gantry.api.parsers``) runs this over every request
body, and the services' validators (``gantry.core.specs``) over every
JSON-stored field, so the admin's forms get the same answer as the API.
"""

from __future__ import annotations

import re
from typing import Any

from gantry.core.errors import InvalidRequest

# Deepest nesting of arrays and objects accepted anywhere (a spec is 3 deep).
MAX_DEPTH = 32
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def problem(value: Any, path: str = "") -> str | None:
    """Why ``value`` cannot be stored, naming where (``spec.steps[0].run``), or None when it can."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            bad = _UNSTORABLE.search(item)
            if bad is not None:
                what = "a NUL character" if bad.group() == "\x00" else "a lone surrogate (invalid Unicode)"
                return f"{where or 'the body'} contains {what}"
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            return f"{where or 'the body'} is nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, dict):
            for key, child in item.items():
                key_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and _UNSTORABLE.search(key):
                    return f"a key in {where or 'the body'} contains a NUL character or a lone surrogate"
                stack.append((child, key_path, depth + 1))
        else:
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
    return None


def check(value: Any, field: str) -> None:
    """Raise InvalidRequest (400) naming ``field`` when ``value`` cannot be stored."""
    why = problem(value, field)
    if why is not None:
        raise InvalidRequest(why, field=field)
