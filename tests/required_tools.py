"""A command-line tool a test needs (promtool, …): its path, a skip with the reason, or under CI a failure.

The same rule as the Docker tests' (tests/launchers_docker/conftest.py): CI
installs every tool (.ci/apt-ensure), so there a missing one fails the test
instead of skipping it silently.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str, package: str) -> str:
    """The path of ``name``; without it, skip (saying which Debian ``package`` has it), or fail under CI=true."""
    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI needs {name} for this test (.ci/apt-ensure installs {package})", pytrace=False)
    pytest.skip(f"needs {name} (the Debian package {package})")
