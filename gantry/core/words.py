"""Durations, counts and places in words, for the pages: "58 min", not "3526 s"; "1 run", not "1 runs"; "3rd".

Plain functions (the template filters in ``gantry.web.templatetags.words``
wrap them), so the API, the admin and messages can say things the same way.
"""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    """'42 s', '7 min', '3 h 5 min', '2 d 4 h': how long, for a person (whole units, rounded down).

    Below two minutes in seconds (a minute and a half is "90 s", not "1 min"),
    then minutes up to an hour, hours and minutes up to a day, then days and
    hours. A negative or missing time reads as "0 s": a clock a little ahead
    of the database's should not print "-3 s".
    """
    if seconds is None or not math.isfinite(seconds):
        return "0 s"
    s = int(max(0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        hours, minutes = s // 3600, s % 3600 // 60
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = s // 86400, s % 86400 // 3600
    return f"{days} d {hours} h" if hours else f"{days} d"


def plural(n: int, word: str, plural_form: str | None = None) -> str:
    """'1 run', '0 runs', '2 runs'; ``plural_form`` for words that do not take an "s" ('1 entry', '3 entries')."""
    return f"{n} {word if n == 1 else (plural_form or word + 's')}"


def ordinal(n: int) -> str:
    """'1st', '2nd', '3rd', '4th', '11th', '12th', '13th', '21st', '112th': a place in line, for a person."""
    # 11, 12 and 13 (and 111, 212, ...) take "th" whatever their last digit says.
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
