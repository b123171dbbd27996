"""Template filters for durations and counts in words (``gantry.core.words``): ``{% load words %}``.

- ``{{ seconds|duration }}`` → "58 min";
- ``{{ n|plural:"run" }}`` → "1 run" / "3 runs"; ``{{ n|plural:"entry,entries" }}`` for irregular words;
- ``{{ start|since:end }}`` → the duration between two datetimes ("" when either is missing).
"""

from __future__ import annotations

from datetime import datetime

from django import template

from gantry.core import words

register = template.Library()


@register.filter
def duration(seconds: float | None) -> str:
    return words.duration(seconds)


@register.filter
def plural(n: int, forms: str) -> str:
    word, _, plural_form = forms.partition(",")
    return words.plural(int(n), word, plural_form or None)


@register.filter
def since(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    return words.duration((end - start).total_seconds())
