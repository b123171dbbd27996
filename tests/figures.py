"""Figures a suite measures (the chaos run's counts, the fuzzer's requests), printed at the end of pytest's output.

A module-scoped fixture computes them once; ``add_figures`` keeps them on the
config and the ``pytest_terminal_summary`` hook in ``tests/conftest.py``
prints them, whether the tests passed or not, so they can be pasted into a
closing note (docs/testing.md).
"""

from __future__ import annotations

import pytest

FIGURES = pytest.StashKey[dict[str, list[str]]]()


def add_figures(config: pytest.Config, suite: str, lines: list[str]) -> None:
    config.stash.setdefault(FIGURES, {})[suite] = lines


def print_figures(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for suite, lines in config.stash.get(FIGURES, {}).items():
        terminalreporter.write_sep("-", f"{suite} figures")
        for line in lines:
            terminalreporter.write_line(f"{suite}: {line}")
