"""``/runner/gantry-runner.pyz``: Gantry's client side as one file, and the runner's own OIDC exchange."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from gantry.core.models import Organization, Run, Runner
from gantry.dispatch.dispatcher import Dispatcher
from gantry.web import runner_client
from tests.github.conftest import AUDIENCE, OWNER, REF, REPO, WORKFLOW, gha_group, pending_runs
from tests.github.fakes import FakeGitHub, OidcIssuer, run_claims


def fetch(path: str) -> Any:
    return Client().get(path)


def test_the_latest_url_redirects_to_the_versioned_one() -> None:
    response = fetch("/runner/gantry-runner.pyz")

    assert response.status_code == 302
    assert response["Cache-Control"] == "no-cache"
    assert response["Location"] == f"/runner/{runner_client.archive().filename}"


def test_the_versioned_file_is_a_zipapp_of_the_runner_packages_named_by_its_hash() -> None:
    archive = runner_client.archive()
    response = fetch(f"/runner/gantry-runner-{archive.version}.pyz")

    assert response.status_code == 200
    data = b"".join(response.streaming_content) if response.streaming else response.content
    assert hashlib.sha256(data).hexdigest() == response["X-Checksum-Sha256"] == archive.sha256
    assert archive.version == archive.sha256[:12]
    assert "immutable" in response["Cache-Control"]
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "__main__.py" in names
    assert "runners/ephemeral.py" in names
    assert "runners/client.py" in names
    assert "gantry_wire/protocol.py" in names  # what the runner shares with the server, imported by it
    assert not [n for n in names if not (n == "__main__.py" or n.startswith(("runners/", "gantry_wire/")))]
    # Built the same way, it is the same file: every web process serves the same version.
    runner_client.archive.cache_clear()
    assert runner_client.archive().sha256 == archive.sha256


def test_another_version_is_a_404() -> None:
    assert fetch("/runner/gantry-runner-000000000000.pyz").status_code == 404


def test_the_file_runs_with_nothing_but_python(tmp_path: Path) -> None:
    pyz = tmp_path / "gantry-runner.pyz"
    pyz.write_bytes(runner_client.archive().data)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # no PYTHONPATH: only the file itself

    helped = subprocess.run([sys.executable, "-I", str(pyz), "--help"], env=env, capture_output=True, text=True)

    assert helped.returncode == 0, helped.stderr
    assert "GANTRY_SERVER" in helped.stdout
    missing = subprocess.run([sys.executable, "-I", str(pyz)], env=env, capture_output=True, text=True)
    assert missing.returncode == 2
    assert "an OIDC token to exchange" in missing.stderr


@pytest.mark.django_db(transaction=True)
def test_a_runner_whose_oidc_token_is_refused_exits_2_and_changes_nothing(
    live_server: Any, acme: Organization, github: FakeGitHub, issuer: OidcIssuer, tmp_path: Path
) -> None:
    gha_group(acme)
    (run,) = pending_runs(acme, 1)
    Dispatcher().tick()
    runner = Runner.objects.get(id=Run.objects.get(id=run.id).assigned_runner_id)
    assert runner.workflow_run_id is not None
    claims = run_claims(owner=OWNER, repo=REPO, workflow_file=WORKFLOW, ref=REF, run_id=runner.workflow_run_id)
    pyz = tmp_path / "gantry-runner.pyz"
    pyz.write_bytes(runner_client.archive().data)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GANTRY_SERVER": live_server.url,
        "GANTRY_RUN_ID": str(run.id),
        "GANTRY_RUNNER_ID": str(runner.id),
        "GANTRY_OIDC_TOKEN": issuer.mint(aud="not-" + AUDIENCE, **claims),
    }

    done = subprocess.run([sys.executable, "-I", str(pyz)], env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 2, done.stderr
    assert "runner.oidc_refused" in done.stderr
    assert "oidc_token_invalid" in done.stderr
    row = Runner.objects.get(id=runner.id)
    assert row.oidc_exchanged_at is None
    assert row.status == "not_ready"
