"""Whole numbers from query strings (gantry.core.params): 1-19 ASCII digits within bounds, else a 400."""

from __future__ import annotations

import pytest

from gantry.core.errors import InvalidRequest
from gantry.core.params import BIGINT_MAX, whole_number


@pytest.mark.parametrize(("raw", "value"), [("0", 0), ("7", 7), ("007", 7), ("9" * 18, int("9" * 18))])
def test_it_reads_ascii_digits(raw: str, value: int) -> None:
    assert whole_number(raw, name="n") == value


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "²",  # str.isdigit() is true for it; int() refuses it
        "\u0661\u0662",  # Arabic-Indic digits: int() would take them
        "+1",
        "-1",
        " 1",
        "1 ",
        "1\n",
        "1_000",
        "1.0",
        "1e3",
        "0x10",
        "9" * 20,
        "9" * 5000,  # past Python's integer-string limit
        "nul\x00",
    ],
)
def test_it_refuses_anything_but_ascii_digits_with_a_400_naming_the_parameter(raw: str | None) -> None:
    with pytest.raises(InvalidRequest) as caught:
        whole_number(raw, name="limit")
    assert caught.value.http_status == 400
    assert caught.value.extra == {"field": "limit"}
    assert "limit" in caught.value.detail


def test_it_keeps_to_the_bounds() -> None:
    assert whole_number("1", name="limit", minimum=1, maximum=500) == 1
    assert whole_number("500", name="limit", minimum=1, maximum=500) == 500
    for raw in ("0", "501"):
        with pytest.raises(InvalidRequest, match="from 1 to 500"):
            whole_number(raw, name="limit", minimum=1, maximum=500)
    assert whole_number(str(BIGINT_MAX), name="id") == BIGINT_MAX
    with pytest.raises(InvalidRequest):
        whole_number(str(BIGINT_MAX + 1), name="id")
