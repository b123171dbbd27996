"""Masking the stack's secrets in a run's log, on the runner, before a byte of it leaves.

Steps run with the stack's secrets in their environment; whatever they print
goes into the log, which members read. :class:`SecretMasker` sits between the
step's pipe and the log buffer and replaces every occurrence of a secret value
with ``***`` — also the value's trivial encodings (base64, URL-quoting, JSON
escaping) and, for a value of several lines, each line on its own, so a
secret printed line by line is masked too.

The log is cut into reads of up to a megabyte and into chunks, and a secret
may straddle either cut. So the masker holds back the end of what it was given
when, and only when, that end is the beginning of a secret (or an encoding of
one), until the next write shows how it goes on, or until :meth:`flush` at the
end of a step. Output that ends any other way goes on at once, so the live log
never waits on the masker; a held tail is never lost.

Values shorter than :data:`MIN_LENGTH` are not masked: masking ``1`` or ``on``
would blank every such character of the log and protect nothing.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections.abc import Callable, Iterable

MASK = b"***"
MIN_LENGTH = 4


def variants(secret: str) -> set[bytes]:
    """The byte strings that reveal ``secret``: itself, its lines, and its cheap encodings."""
    raw = secret.encode("utf-8")
    out = {raw}
    out.update(line.encode("utf-8") for line in secret.splitlines())
    out.add(urllib.parse.quote(secret, safe="").encode())
    out.add(urllib.parse.quote_plus(secret).encode())
    out.add(json.dumps(secret)[1:-1].encode())
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        out.add(encode(raw).rstrip(b"="))
    return {v for v in out if len(v) >= MIN_LENGTH}


class SecretMasker:
    """A streaming filter: ``write`` masked bytes on to ``sink``, holding back a possible partial secret."""

    def __init__(self, secrets: Iterable[str], sink: Callable[[bytes], None]) -> None:
        patterns: set[bytes] = set()
        for value in secrets:
            patterns |= variants(value)
        self._sink = sink
        self._held = b""
        # Longest first, so a secret is masked whole rather than by a shorter line of it.
        ordered = sorted(patterns, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(p) for p in ordered)) if ordered else None
        # Every proper prefix of a pattern: an output ending in one may be a secret cut in two.
        self._prefixes = {p[:i] for p in ordered for i in range(1, len(p))}
        self._keep = max((len(p) for p in ordered), default=1) - 1

    @property
    def active(self) -> bool:
        return self._pattern is not None

    def write(self, data: bytes) -> None:
        if self._pattern is None:
            self._sink(data)
            return
        text = self._pattern.sub(MASK, self._held + data)
        hold = self._held_length(text)
        self._held = text[len(text) - hold :] if hold else b""
        if len(text) > hold:
            self._sink(text[: len(text) - hold])

    def _held_length(self, text: bytes) -> int:
        """The longest end of ``text`` that is the beginning of a pattern (0 if none)."""
        for size in range(min(self._keep, len(text)), 0, -1):
            if text[-size:] in self._prefixes:
                return size
        return 0

    def flush(self) -> None:
        """Pass on what was held back (the step is over: nothing will complete it)."""
        if self._held:
            held, self._held = self._held, b""
            self._sink(held)
