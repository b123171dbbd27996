"""gantry/conf.py, called directly: every server variable read there, a bad one refused by name, each documented once.

tests/ops/test_settings.py proves the same refusals stop a real start-up
(``manage.py check`` in a fresh process); these call conf's readers in this
process, uncached (``__wrapped__``), so the settings already loaded stay as
they are.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from gantry import conf
from tests.test_layers import _env_reads

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No GANTRY_* variable (nor the others conf.django reads) set: the defaults."""
    for name in list(os.environ):
        if name.startswith(("GANTRY_", "AWS_")) or name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("DJANGO_SECRET_KEY", raising=False)
    return monkeypatch


def test_it_gives_the_documented_defaults(clean_env: pytest.MonkeyPatch) -> None:
    env = conf.django.__wrapped__()

    assert env.debug is False
    assert env.secret_key == ""
    assert env.allowed_hosts == ["127.0.0.1", "localhost", "[::1]", "testserver"]
    assert env.csrf_trusted_origins == []
    assert env.password_link_ttl == 3 * 24 * 3600
    assert env.log_level == "INFO"
    assert (env.database_url, env.redis_url, env.celery_broker_url) == ("", "", "")
    assert env.embedded is False
    assert env.redis_db is None
    assert (env.db_pool, env.db_pool_min, env.db_pool_max, env.db_pool_timeout) == (True, 2, 20, 10)
    assert env.celery_queue == "gantry"
    assert env.jwt_keys == {}
    assert env.s3_addressing_style == "auto"
    assert conf.data_dir() == (ROOT / ".gantry-data").resolve()


def test_it_reads_the_values_given(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = "s" * 32
    clean_env.setenv("GANTRY_JWT_KEYS", f"new:{secret},old:{secret}")
    clean_env.setenv("GANTRY_REDIS_DB", "8")
    clean_env.setenv("GANTRY_LOG_LEVEL", " warning ")
    clean_env.setenv("GANTRY_ALLOWED_HOSTS", "gantry.example.com, web")
    clean_env.setenv("AWS_REGION", "eu-west-3")
    clean_env.setenv("GANTRY_DATA_DIR", str(tmp_path / "data"))
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file\n")
    clean_env.setenv("GANTRY_SECRET_KEY_FILE", str(key_file))

    env = conf.django.__wrapped__()

    assert list(env.jwt_keys) == ["new", "old"]  # the first signs
    assert env.redis_db == 8
    assert env.log_level == "WARNING"
    assert env.allowed_hosts == ["gantry.example.com", "web"]
    assert env.s3_region == "eu-west-3"
    assert env.secret_key == "from-a-file"
    assert "from-a-file" not in repr(env)
    assert conf.data_dir() == tmp_path / "data"
    assert not (tmp_path / "data").exists()  # embedded.data_dir creates it, not conf


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GANTRY_DEBUG", "maybe"),
        ("GANTRY_EMBEDDED", "perhaps"),
        ("GANTRY_SECURE_COOKIES", "2"),
        ("GANTRY_DB_POOL", "sometimes"),
        ("GANTRY_DB_POOL_MIN", "-1"),
        ("GANTRY_DB_POOL_MAX", "lots"),
        ("GANTRY_DB_POOL_TIMEOUT", "0"),
        ("GANTRY_PASSWORD_LINK_TTL", "59"),
        ("GANTRY_REDIS_DB", "16"),
        ("GANTRY_REDIS_DB", "one"),
        ("GANTRY_JWT_KEYS", "k1:too-short"),
        ("GANTRY_JWT_KEYS", "no-kid-separator" * 4),
        ("GANTRY_SECRETS_KEYS", "not-a-fernet-key"),
        ("GANTRY_S3_ADDRESSING_STYLE", "sideways"),
        ("GANTRY_LOG_LEVEL", "LOUD"),
        ("GANTRY_SECRET_KEY_FILE", "/nonexistent/gantry-secret-key"),
    ],
)
def test_a_malformed_value_is_refused_by_name(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env.setenv(name, value)

    with pytest.raises(ImproperlyConfigured, match=name):
        conf.django.__wrapped__()


def test_every_variable_the_server_reads_is_documented_once() -> None:
    """docs/configuration.md has one table row per variable conf.py (or a server-process module) reads."""
    read = {name for _, name in _env_reads(ast.parse((ROOT / "gantry" / "conf.py").read_text()))}
    assert len(read) > 40  # the control: the reads were found
    rows = re.findall(r"^\| `(GANTRY_\w+)`", (ROOT / "docs" / "configuration.md").read_text(), flags=re.M)

    assert sorted(n for n in read if rows.count(n) != 1) == []
