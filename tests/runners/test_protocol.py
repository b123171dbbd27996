"""The runner protocol's shared constants agree with the server's own definitions."""

from __future__ import annotations

from gantry.api.runner_views import RECONCILE_MAX_LINE, RECONCILE_MAX_LINES, RECONCILE_MAX_WORKERS
from gantry.core.models import TERMINAL, RunStatus
from gantry_wire import protocol
from gantry_wire.protocol import STEP_INHERITED_ENV, TERMINAL_STATUSES, truncation_line
from runners import reconcile


def test_the_runners_terminal_statuses_are_the_servers() -> None:
    assert frozenset(str(s) for s in TERMINAL) == TERMINAL_STATUSES
    assert set(RunStatus.values) >= TERMINAL_STATUSES


def test_no_step_inherits_a_gantry_credential() -> None:
    assert not [name for name in STEP_INHERITED_ENV if name.startswith("GANTRY_")]


def test_the_truncation_line_is_one_line_naming_the_limit() -> None:
    line = truncation_line(1234)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert b"1234" in line
    assert b"GANTRY_LOG_MAX_BYTES" in line


def test_a_reconcile_report_fits_the_servers_bounds() -> None:
    assert protocol.RECONCILE_MAX_WORKERS == RECONCILE_MAX_WORKERS
    assert reconcile.MAX_WORKERS == RECONCILE_MAX_WORKERS
    assert reconcile.LAST_LINES <= RECONCILE_MAX_LINES
    assert reconcile.LINE_CHARS <= RECONCILE_MAX_LINE


def test_the_version_a_coordinator_sends_is_the_projects() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == protocol.VERSION
