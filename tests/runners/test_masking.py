"""Secret masking on the runner (runners/masking.py): whole values, their encodings, and every cut."""

from __future__ import annotations

import base64
import urllib.parse

from hypothesis import given, settings
from hypothesis import strategies as st

from runners.masking import MASK, SecretMasker

SECRET = "s3cr3t-Value/42"


def masked(chunks: list[bytes], secrets: list[str]) -> bytes:
    out: list[bytes] = []
    masker = SecretMasker(secrets, out.append)
    for chunk in chunks:
        masker.write(chunk)
    masker.flush()
    return b"".join(out)


def test_a_secret_and_its_cheap_encodings_become_stars() -> None:
    text = (
        f"plain {SECRET}\n"
        f"b64 {base64.b64encode(SECRET.encode()).decode()}\n"
        f"url {urllib.parse.quote(SECRET, safe='')}\n"
        f'json "{SECRET}"\n'
    ).encode()
    out = masked([text], [SECRET])
    assert SECRET.encode() not in out
    assert base64.b64encode(SECRET.encode()) not in out
    assert urllib.parse.quote(SECRET, safe="").encode() not in out
    assert out == b'plain ***\nb64 ***\nurl ***\njson "***"\n'


def test_each_line_of_a_multi_line_secret_is_masked_on_its_own() -> None:
    key = "-----BEGIN KEY-----\nAAAAbbbbCCCC\nddddEEEE\n-----END KEY-----"
    out = masked([b"first AAAAbbbbCCCC then ddddEEEE\n"], [key])
    assert out == b"first *** then ***\n"


def test_short_values_are_not_masked() -> None:
    assert masked([b"on 1 abc\n"], ["on", "1", "abc"]) == b"on 1 abc\n"


def test_output_without_secrets_passes_unchanged_and_in_order() -> None:
    chunks = [b"one\n", b"two ", b"three\n"]
    assert masked(chunks, []) == b"".join(chunks)
    assert masked(chunks, [SECRET]) == b"".join(chunks)


@settings(max_examples=200, deadline=None)
@given(
    # Around the secret, bytes that cannot form it or the mask: the input is then recoverable exactly.
    prefix=st.text(alphabet="xyz \n", max_size=40).map(str.encode),
    suffix=st.text(alphabet="xyz \n", max_size=40).map(str.encode),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_a_secret_split_across_any_writes_is_still_masked(prefix: bytes, suffix: bytes, cuts: list[int]) -> None:
    data = prefix + SECRET.encode() + suffix
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    out = masked(chunks, [SECRET])
    assert SECRET.encode() not in out
    assert MASK in out
    # Nothing else is lost or reordered: unmasking the one occurrence gives the input back.
    assert out == prefix + MASK + suffix


def test_output_is_held_back_only_while_it_may_be_the_start_of_a_secret() -> None:
    out: list[bytes] = []
    masker = SecretMasker([SECRET], out.append)
    masker.write(b"progress 10%\n")
    assert out == [b"progress 10%\n"]  # nothing like a secret: on at once, for the live log
    masker.write(b"value " + SECRET[:5].encode())
    assert b"".join(out) == b"progress 10%\nvalue "  # the start of the secret waits
    masker.write(SECRET[5:].encode() + b" done\n")
    assert b"".join(out) == b"progress 10%\nvalue *** done\n"
