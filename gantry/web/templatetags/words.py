"""Template filters for durations and counts in words (``gantry.core.words``): ``{% load words %}``.

- ``{{ seconds|duration }}`` → "58 min";
- ``{{ n|plural:"run" }}`` → "1 run" / "3 runs"; ``{{ n|plural:"entry,entries" }}`` for irregular words;
- ``{{ start|since:end }}`` → the duration between two datetimes ("" when either is missing);
- ``{{ reason|reason_detail }}`` → a queue reason's sentence with its lane holder linked and its times as
  ``<time>`` elements.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django import template
from django.urls import reverse
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

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


# A time as the services write it in a sentence (gantry.dispatch.queue._when): "2026-01-01 10:00:00 UTC".
_SENTENCE_TIME = re.compile(r"\b(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d) UTC\b")


def time_element(at: datetime) -> str:
    """The one markup for a time on every page: gantry.js turns it into local time and a relative form."""
    at = at.astimezone(UTC)
    return format_html('<time datetime="{}">{} UTC</time>', at.isoformat(), at.strftime("%Y-%m-%d %H:%M"))


@register.filter
def reason_detail(reason: dict[str, Any] | None) -> str:
    """A queue reason's sentence as HTML: the lane holder's id a link to its run, each time a ``<time>``."""
    if not reason:
        return ""
    text = str(escape(reason.get("detail", "")))
    holder = reason.get("lane_holder_run_id")
    if holder:
        href = reverse("web:run", kwargs={"pk": holder})
        text = text.replace(str(holder), str(format_html('<a href="{}" data-lane-holder>{}</a>', href, holder)))

    def timed(m: re.Match[str]) -> str:
        return time_element(datetime.fromisoformat(f"{m[1]}T{m[2]}+00:00"))

    # Safe: built from the escaped sentence and format_html pieces only.
    return mark_safe(_SENTENCE_TIME.sub(timed, text))
