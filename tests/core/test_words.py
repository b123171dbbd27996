"""Durations and counts in words (gantry.core.words) and their template filters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template

from gantry.core import words


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "0 s"),
        (1, "1 s"),
        (42.9, "42 s"),
        (119, "119 s"),
        (120, "2 min"),
        (3526, "58 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (3600 * 3 + 5 * 60, "3 h 5 min"),
        (86399, "23 h 59 min"),
        (86400, "1 d"),
        (86400 * 2 + 3600 * 4 + 59, "2 d 4 h"),
        (-3, "0 s"),
        (None, "0 s"),
        (float("nan"), "0 s"),
        (float("inf"), "0 s"),
    ],
)
def test_it_says_a_duration_in_the_largest_fitting_units(seconds: float | None, said: str) -> None:
    assert words.duration(seconds) == said


@pytest.mark.parametrize(
    ("n", "said"),
    [(0, "0 runs"), (1, "1 run"), (2, "2 runs"), (1_000_000, "1000000 runs")],
)
def test_it_pluralizes_a_count(n: int, said: str) -> None:
    assert words.plural(n, "run") == said


def test_it_takes_an_irregular_plural() -> None:
    assert words.plural(1, "entry", "entries") == "1 entry"
    assert words.plural(3, "entry", "entries") == "3 entries"


def test_it_offers_the_words_as_template_filters() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    html = Template(
        '{% load words %}{{ s|duration }}|{{ one|plural:"run" }}|{{ two|plural:"entry,entries" }}|'
        "{{ start|since:end }}|{{ start|since:none }}"
    ).render(
        Context({"s": 3526, "one": 1, "two": 2, "start": start, "end": start + timedelta(minutes=7), "none": None})
    )
    assert html == "58 min|1 run|2 entries|7 min|"
