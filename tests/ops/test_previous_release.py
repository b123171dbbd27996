"""The protocol's compatibility promise: the previous release's coordinator and runner against this server.

An upgrade replaces the servers first; coordinators and the runner images
they launch follow later, group by group (docs/operations.md, "Upgrades").
So this server must run a previous release's coordinator and ephemeral runner
to a succeeded run with its log. The previous release's ``runners`` and
``launchers`` are taken from git (:data:`PREVIOUS_RELEASE`) into a folder of
their own and started from there, against tests/e2e's real server (gunicorn,
its own database, moto's S3).

It needs the repository's history (CI runs on a clone of main): without git
or the commit the test is skipped with the reason, and fails under
``CI=true``, where a skip would hide that the promise went unchecked.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.e2e import conftest as e2e
from tests.e2e.conftest import Coordinator, Lab, venv_env, wait_until

pytestmark = pytest.mark.e2e

# tests/e2e's real server and one test's group and stack.
server = e2e.server
moto_s3 = e2e.moto_s3
lab = e2e.lab

# The previous release: the last commit before `runners` moved its shared
# protocol module into gantry_wire and the server into gantry/server. There are
# no release tags yet; at each release, set this to the commit of the release
# before the one being made (the oldest coordinator and runner still promised
# to work, docs/operations.md "Upgrades"), and run this test.
PREVIOUS_RELEASE = "9978e8e"
# What a coordinator of that release needs: the runner and the launchers (it had no gantry_wire).
PACKAGES = ("runners", "launchers")


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=e2e.ROOT, capture_output=True, timeout=120, check=False)


def _unavailable(problem: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI needs the previous release from git history: {problem}", pytrace=False)
    pytest.skip(f"needs the previous release from git history: {problem}")


@pytest.fixture
def previous_release(tmp_path: Path) -> Path:
    """The previous release's packages, extracted into a folder of their own."""
    if shutil.which("git") is None:
        _unavailable("git is not installed")
    if _git("cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}").returncode != 0:
        _unavailable(f"commit {PREVIOUS_RELEASE} is not in this clone (a shallow clone? fetch the history)")
    archive = _git("archive", "--format=tar", PREVIOUS_RELEASE, *PACKAGES)
    assert archive.returncode == 0, archive.stderr.decode()
    root = tmp_path / "previous"
    root.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root


def test_the_previous_releases_coordinator_and_runner_finish_a_run(lab: Lab, previous_release: Path) -> None:
    # The test is worth something only while the previous release's client differs from today's.
    assert _git("diff", "--quiet", PREVIOUS_RELEASE, "HEAD", "--", "runners").returncode == 1
    env = venv_env(GANTRY_GROUP_TOKEN=lab.group_token, GANTRY_STOP_GRACE="3", PYTHONPATH=str(previous_release))
    # Started from the old tree, `python -m` finds its packages first; the checkout is not on the path.
    where = subprocess.run(
        [sys.executable, "-c", "import runners, launchers; print(runners.__file__); print(launchers.__file__)"],
        cwd=previous_release, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert all(Path(line).is_relative_to(previous_release) for line in where.stdout.split()), where.stdout

    state = lab.tmp / "state"
    log = lab.tmp / "previous-coordinator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "runners.coordinator", "--server", lab.server.url,
                "--launcher", "local", "--state-dir", str(state), "--max-parallel", "2", "--wait", "5",
                "--backoff-cap", "2",
            ],
            cwd=previous_release, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    coordinator = Coordinator(proc, log, state)
    lab.coordinators.append(coordinator)  # the lab stops it, and kills its workers, whatever happens
    wait_until(lambda: coordinator.named("coordinator.started") or proc.poll() is not None, 60,
               "the previous release's coordinator to start")  # fmt: skip
    assert proc.poll() is None, log.read_text()

    run_id = lab.deploy(
        [
            {"name": "hello", "run": 'echo "hello $WHO"'},
            {"name": "count", "run": "for i in 1 2 3; do echo tick $i; done"},
        ],
        env={"WHO": "old runner"},
    )
    run = lab.wait_terminal(run_id)
    assert run["status"] == "succeeded", run
    assert run["exit_code"] == 0
    kinds = [event["kind"] for event in run["events"]]
    assert kinds.count("finished") == 1, kinds
    text, _ = lab.read_log(run_id)
    assert text.startswith("==> [1/2] hello\nhello old runner\n==> [1/2] hello: exit code 0"), text
    assert "tick 1\ntick 2\ntick 3\n==> [2/2] count: exit code 0" in text
    assert coordinator.named("run.claimed", run_id)
    assert coordinator.named("worker.launched", run_id)
