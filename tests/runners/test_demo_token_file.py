"""``demo_setup --token-file``: how ``dev.py run`` hands the demo group's token to its coordinator."""

from __future__ import annotations

import stat
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from gantry.core import services, tokens
from gantry.core.models import RunnerGroup

pytestmark = pytest.mark.django_db


def demo_setup(token_file: Path) -> str:
    out = StringIO()
    call_command("demo_setup", "--admin", "demo-admin", "--token-file", str(token_file), stdout=out)
    return out.getvalue()


def test_it_writes_a_valid_token_to_a_private_file_and_never_prints_it(tmp_path: Path) -> None:
    path = tmp_path / "data" / "demo-group-token"
    output = demo_setup(path)

    token = path.read_text().strip()
    assert token not in output
    assert f"group token written to {path}" in output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    group = RunnerGroup.objects.get(organization__slug="demo", name="local")
    claims = tokens.decode(token)
    assert (claims.audience, claims.subject, claims.raw["ver"]) == (tokens.AUD_GROUP, str(group.id), 1)


def test_it_keeps_a_valid_token_and_rotates_a_missing_or_revoked_one(tmp_path: Path) -> None:
    path = tmp_path / "demo-group-token"
    demo_setup(path)
    first = path.read_text()

    assert "is valid" in demo_setup(path)
    assert path.read_text() == first

    path.unlink()
    assert "token rotated" in demo_setup(path)
    second = path.read_text()
    assert second != first

    group = RunnerGroup.objects.get(organization__slug="demo", name="local")
    services.runner_group_rotate_token(group=group)  # from the admin: the file's token is revoked
    assert "token rotated" in demo_setup(path)
    group.refresh_from_db()
    assert tokens.decode(path.read_text().strip()).raw["ver"] == group.token_version == 4
