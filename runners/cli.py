"""What the coordinator's and the ephemeral runner's command lines share: numbers read from the environment.

A malformed variable is a usage error (argparse's exit code 2, with a
message naming the variable), never a traceback or another exit code.
"""

from __future__ import annotations

import argparse
import os

# typing stays out of a runner's start-up (docs/runners.md): these are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn, TypeVar

    N = TypeVar("N", int, float)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``prog: error: ...``) and exit 2, without the usage
    block: a daemon's log collector and a test both read one line; ``--help`` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def env_number(parser: argparse.ArgumentParser, name: str, convert: Callable[[str], N], default: N) -> N:
    """The variable ``name`` as an ``int`` or ``float`` (``convert``), ``default`` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return convert(raw)
    except ValueError:
        kind = "an integer" if convert is int else "a number"
        parser.error(f"{name} must be {kind}, not {raw!r}")


def check_range(parser: argparse.ArgumentParser, value: float, what: str, low: float, high: float | None) -> None:
    """Refuse ``value`` outside ``[low, high]`` (and NaN) as a usage error naming ``what`` (flag and variable)."""
    inside = value >= low and (high is None or value <= high)
    if not inside:
        span = f"at least {low:g}" if high is None else f"from {low:g} to {high:g}"
        parser.error(f"{what} must be {span}, not {value!r}")
