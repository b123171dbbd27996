"""Query-string numbers read strictly: what a person or a client may type, nothing Python's ``int()`` also takes.

``str.isdigit()`` is true for "²" and other Unicode digits that ``int()``
refuses, and ``int()`` takes " 1", "+1", "1_000" and refuses 5,000 nines
(Python's integer-string limit): each of those was a 500 or a surprise. A
whole number here is 1 to 19 ASCII digits (19 digits fit a PostgreSQL
bigint's order of magnitude, so no comparison ever needs a big integer),
within the caller's bounds; anything else is a 400 ``invalid_request``
naming the parameter.
"""

from __future__ import annotations

import re

from gantry.core.errors import InvalidRequest

_WHOLE = re.compile(r"[0-9]{1,19}")
BIGINT_MAX = 2**63 - 1


def whole_number(raw: str | None, *, name: str, minimum: int = 0, maximum: int = BIGINT_MAX) -> int:
    """``raw`` as an int from ``minimum`` to ``maximum``; :class:`InvalidRequest` (400) otherwise."""
    # fullmatch, not match: "$" would let a trailing newline through.
    if raw is None or _WHOLE.fullmatch(raw) is None:
        raise InvalidRequest(f"{name} must be a whole number from {minimum} to {maximum}", field=name)
    value = int(raw)
    if not minimum <= value <= maximum:
        raise InvalidRequest(f"{name} must be a whole number from {minimum} to {maximum}", field=name)
    return value


def wait_seconds(raw: str, *, maximum: float, name: str = "wait") -> float:
    """A long poll's ``wait``: a number of seconds from 0 to ``maximum`` (fractions allowed); 400 otherwise."""
    try:
        wait = float(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be a number of seconds from 0 to {maximum:g}", field=name) from None
    if not 0 <= wait <= maximum:  # NaN fails this too
        raise InvalidRequest(f"{name} must be from 0 to {maximum:g} seconds", field=name)
    return wait
