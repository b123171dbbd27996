"""A malformed number in the environment is a usage error: exit 2 and a message naming the variable.

Both programs are run as the real commands (``python -m runners.coordinator``,
``python -m runners.ephemeral``), with everything else they need given, so
the variable under test is the only thing wrong. Neither reaches a server:
the arguments are checked before anything else happens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runners.conftest import ROOT

BASE_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "PYTHONPATH": str(ROOT),
    "GANTRY_SERVER": "http://127.0.0.1:9",
}


def run(module: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    extra = {"GANTRY_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={**BASE_ENV, **extra, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


COORDINATOR = {"GANTRY_GROUP_TOKEN": "not.a.token"}
RUNNER = {"GANTRY_RUN_ID": "r", "GANTRY_RUNNER_ID": "x", "GANTRY_RUNNER_TOKEN": "not.a.token"}


@pytest.mark.parametrize(
    ("module", "required", "name", "value"),
    [
        ("runners.coordinator", COORDINATOR, "GANTRY_MAX_PARALLEL", "four"),
        ("runners.coordinator", COORDINATOR, "GANTRY_MAX_PARALLEL", "2.5"),
        ("runners.coordinator", COORDINATOR, "GANTRY_MAX_PARALLEL", "0"),
        ("runners.coordinator", COORDINATOR, "GANTRY_POLL_WAIT", "30s"),
        ("runners.coordinator", COORDINATOR, "GANTRY_POLL_WAIT", "31"),
        ("runners.coordinator", COORDINATOR, "GANTRY_POLL_WAIT", "nan"),
        ("runners.coordinator", COORDINATOR, "GANTRY_STOP_GRACE", "ten"),
        ("runners.coordinator", COORDINATOR, "GANTRY_STOP_GRACE", "-1"),
        ("runners.coordinator", COORDINATOR, "GANTRY_RECONCILE_INTERVAL", "5s"),
        ("runners.coordinator", COORDINATOR, "GANTRY_RECONCILE_INTERVAL", "0"),
        ("runners.coordinator", COORDINATOR, "GANTRY_RECONCILE_INTERVAL", "inf"),
        ("runners.ephemeral", RUNNER, "GANTRY_STOP_GRACE", "ten"),
        ("runners.ephemeral", RUNNER, "GANTRY_STOP_GRACE", "-3"),
        ("runners.ephemeral", RUNNER, "GANTRY_STOP_GRACE", "nan"),
    ],
)
def test_a_malformed_variable_is_a_usage_error_naming_it(
    tmp_path: Path, module: str, required: dict[str, str], name: str, value: str
) -> None:
    result = run(module, tmp_path, **required, **{name: value})
    assert result.returncode == 2, result.stderr
    assert name in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()  # refused before it touched anything


@pytest.mark.parametrize(
    ("name", "value"),
    [("GANTRY_MAX_PARALLEL", "3"), ("GANTRY_POLL_WAIT", "0"), ("GANTRY_STOP_GRACE", "0"),
     ("GANTRY_RECONCILE_INTERVAL", "0.5"), ("GANTRY_MAX_PARALLEL", "")],
)  # fmt: skip
def test_a_wellformed_variable_is_taken(tmp_path: Path, name: str, value: str) -> None:
    # --help exits 0 once the defaults (read from the environment) have been parsed.
    result = subprocess.run(
        [sys.executable, "-m", "runners.coordinator", "--help"],
        cwd=ROOT,
        env={**BASE_ENV, name: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
