"""``manage.py`` works where ``dev.py run`` works, and says in one line what is missing elsewhere (issue 23).

The development checkout is a data folder that holds the embedded databases:
``dev.py manage`` makes it here (as ``dev.py run`` would), then a bare
``manage.py`` with none of DATABASE_URL, REDIS_URL or GANTRY_EMBEDDED set must
reach the same servers. ``dev.py stop`` ends them whatever happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Whatever the shell running the suite has: none of it may reach the child.
CONFIG = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")


def _bare_env(data: Path) -> dict[str, str]:
    """No database settings, none of Gantry's variables (GANTRY_EMBEDDED, GANTRY_DEBUG): a fresh shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_") and k not in CONFIG}
    env["GANTRY_DATA_DIR"] = str(data)
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["help", "check", "migrate"])
def test_it_says_what_to_set_in_one_line_without_a_configuration(tmp_path: Path, command: str) -> None:
    result = _run([sys.executable, "manage.py", command], _bare_env(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "DATABASE_URL and REDIS_URL must be set" in lines[0]
    assert "python3 dev.py manage" in lines[0]
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []  # refused before anything was written: no secret key, no servers


def test_a_malformed_setting_is_one_line_too(tmp_path: Path) -> None:
    env = _bare_env(tmp_path) | {"GANTRY_EMBEDDED": "1", "GANTRY_REDIS_DB": "16"}
    result = _run([sys.executable, "manage.py", "check"], env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ImproperlyConfigured: GANTRY_REDIS_DB must be a Redis database number from 0 to 15, not '16'"
    ]


@pytest.mark.e2e
def test_manage_py_reaches_the_embedded_databases_of_a_development_checkout(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    data = tmp_path / "data"
    env = _bare_env(data)
    request.addfinalizer(lambda: _run([sys.executable, str(ROOT / "dev.py"), "stop"], env))

    # dev.py passes the command through with run's environment, which boots the embedded servers.
    first = _run([sys.executable, "dev.py", "manage", "migrate", "--noinput"], env)
    assert first.returncode == 0, first.stderr
    assert (data / "postgres" / "PG_VERSION").is_file()

    # A bare manage.py now finds them: Gantry's own commands are listed, no note about settings.
    helped = _run([sys.executable, "manage.py", "help"], env)
    assert helped.returncode == 0, helped.stderr
    assert "[core]" in helped.stdout
    assert "[reapers]" in helped.stdout
    assert "not properly configured" not in helped.stdout + helped.stderr

    # And the same database: the migrations dev.py ran are there.
    shown = _run([sys.executable, "manage.py", "showmigrations", "core", "--plan"], env)
    assert shown.returncode == 0, shown.stderr
    assert "[X]  core.0001_initial" in shown.stdout
    assert "[ ]" not in shown.stdout

    # dev.py manage hands back the command's own exit status.
    failed = _run([sys.executable, "dev.py", "manage", "no_such_command"], env)
    assert failed.returncode == 1
    assert "Unknown command: 'no_such_command'" in failed.stderr

    stop = _run([sys.executable, str(ROOT / "dev.py"), "stop"], env)
    assert "PostgreSQL: stopped" in stop.stdout
    assert "Redis: stopped" in stop.stdout
