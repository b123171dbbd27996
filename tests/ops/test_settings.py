"""A malformed setting stops the process at start, with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Settings fail before anything connects, so these URLs are never dialled; they
# keep the subprocess off the embedded default (which would boot servers).
UNUSED_SERVICES = {
    "DATABASE_URL": "postgres://nobody@127.0.0.1:9/unused",
    "REDIS_URL": "redis://127.0.0.1:9/0",
}


def _check(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_") and k != "CELERY_BROKER_URL"}
    env.update(UNUSED_SERVICES)
    env["GANTRY_DATA_DIR"] = str(tmp_path)
    env.update(overrides)
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_it_starts_with_the_defaults(tmp_path: Path) -> None:
    # The control for the cases below: only the bad value makes them fail.
    result = _check(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"GANTRY_ASSIGNMENT_TTL": "abc"}, "GANTRY_ASSIGNMENT_TTL"),
        ({"GANTRY_ASSIGNMENT_TTL": "600", "GANTRY_STUB_CUTOFF": "600"}, "GANTRY_STUB_CUTOFF"),
        ({"GANTRY_STUB_CUTOFF": "60"}, "GANTRY_STUB_CUTOFF"),
        ({"GANTRY_ASSIGNMENT_TTL": "0"}, "GANTRY_ASSIGNMENT_TTL"),
        ({"GANTRY_POLL_MAX_WAIT": "301"}, "GANTRY_POLL_MAX_WAIT"),
        ({"GANTRY_RATE_LIMIT_ENABLED": "maybe"}, "GANTRY_RATE_LIMIT_ENABLED"),
        ({"GANTRY_JWT_KEYS": "k1:too-short"}, "GANTRY_JWT_KEYS"),
        ({"DATABASE_URL": "mysql://root@127.0.0.1/gantry"}, "DATABASE_URL"),
        ({"GANTRY_REDIS_DB": "16"}, "GANTRY_REDIS_DB"),
        ({"GANTRY_SECRETS_KEYS": "not-a-fernet-key"}, "GANTRY_SECRETS_KEYS"),
        ({"GANTRY_RUNNER_FORCE_GATE": "60"}, "GANTRY_RUNNER_FORCE_GATE"),
        ({"GANTRY_RETENTION_DAYS": "-1"}, "GANTRY_RETENTION_DAYS"),
        ({"GANTRY_RETENTION_DAYS": "thirty"}, "GANTRY_RETENTION_DAYS"),
        ({"GANTRY_RETENTION_DAYS": "100000"}, "GANTRY_RETENTION_DAYS"),
        ({"GANTRY_RETENTION_BATCH_SIZE": "1000", "GANTRY_RETENTION_MAX_ROWS": "10"}, "GANTRY_RETENTION_MAX_ROWS"),
        # Read in gantry/conf.py for settings.py (conf.django()), checked before Django starts.
        ({"GANTRY_DEBUG": "maybe"}, "GANTRY_DEBUG"),
        ({"GANTRY_DB_POOL_MAX": "lots"}, "GANTRY_DB_POOL_MAX"),
        ({"GANTRY_LOG_LEVEL": "LOUD"}, "GANTRY_LOG_LEVEL"),
        ({"GANTRY_S3_ADDRESSING_STYLE": "sideways"}, "GANTRY_S3_ADDRESSING_STYLE"),
    ],
)
def test_it_refuses_to_start_with_a_bad_setting(tmp_path: Path, overrides: dict[str, str], named: str) -> None:
    result = _check(tmp_path, **overrides)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert named in result.stderr


def test_a_production_server_without_database_urls_refuses_the_embedded_databases(tmp_path: Path) -> None:
    unset = ("DATABASE_URL", "REDIS_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_") and k not in unset}
    env["GANTRY_DATA_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "DATABASE_URL and REDIS_URL must be set" in result.stderr
    assert not (tmp_path / "postgres").exists()  # nothing was booted


def test_the_suite_runs_on_a_redis_database_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dev.py test` beside `dev.py run` must not delete the dev server's throttle buckets (issue 10)."""
    sys.path.insert(0, str(ROOT))
    import dev

    suite_db = os.environ.get("GANTRY_REDIS_DB")
    monkeypatch.delenv("GANTRY_REDIS_DB", raising=False)
    assert dev.test_redis_db("redis://127.0.0.1:6379/0") == "8"
    assert dev.test_redis_db("redis://127.0.0.1:6379/3") == "11"
    assert dev.test_redis_db(None) == "8"  # the embedded Redis serves the dev server on 0
    show = "from django.conf import settings; print(settings.REDIS_URL)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_")}
    env.update(UNUSED_SERVICES, GANTRY_DATA_DIR=str(tmp_path), GANTRY_REDIS_DB="8")
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", show], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.stdout.strip().splitlines()[-1] == "redis://127.0.0.1:9/8"
    # This very suite: a database other than the configured one.
    from django.conf import settings

    if suite_db:
        assert settings.REDIS_URL.endswith("/" + suite_db)


@pytest.mark.parametrize(("in_worker", "scheduled"), [("", True), ("true", True), ("false", False)])
def test_beat_runs_the_dispatcher_in_the_worker_unless_told_not_to(
    tmp_path: Path, in_worker: str, scheduled: bool
) -> None:
    # With GitHub configured, beat schedules the dispatcher's loop task; deploy/kubernetes runs
    # `manage.py dispatcher` instead and switches it off (GANTRY_DISPATCH_IN_WORKER=false).
    show = "from django.conf import settings; print(sorted(settings.CELERY_BEAT_SCHEDULE))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_")}
    env.update(UNUSED_SERVICES, GANTRY_DATA_DIR=str(tmp_path), GANTRY_GITHUB_TOKEN="ghp_example")
    env["GANTRY_PUBLIC_URL"] = "https://gantry.example.com"
    if in_worker:
        env["GANTRY_DISPATCH_IN_WORKER"] = in_worker
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", show], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    schedule = out.stdout.strip().splitlines()[-1]
    assert "reap-expired-assignments" in schedule  # the reapers either way
    assert ("dispatch-github" in schedule) is scheduled
