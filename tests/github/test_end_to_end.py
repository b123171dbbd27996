"""A github_actions run end to end, with no coordinator: the backend dispatcher, the local GitHub playing
GitHub Actions, the workflow template's steps as a real process, the OIDC exchange, the served runner zipapp.

Gantry serves on ``live_server`` (a thread of this process, on the test
database). The dispatcher runs its long-running loop in a thread, woken by
the NOTIFY a new run sends (its backstop tick is set far beyond the test's
wait, so only the notification can explain a dispatch). On the dispatch, the
local GitHub runs the template's steps with bash: ``curl`` fetches
``/runner/gantry-runner.pyz`` from Gantry, and ``python3`` runs it; the
runner asks the job's OIDC endpoint (the local issuer) for a token with the
audience the template names, exchanges it, and runs the run.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from gantry import conf
from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunStatus
from gantry.dispatch.dispatcher import Dispatcher
from tests.github.conftest import AUDIENCE, gha_group, gha_stack
from tests.github.fakes import FakeGitHub

pytestmark = pytest.mark.e2e


def wait_until(cond: Callable[[], Any], timeout: float, what: str, github: FakeGitHub) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- job {r.id} ---\n{r.log.read_text()[-3000:]}" for r in github.runs.values() if r.log)
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{logs}")
        time.sleep(0.1)


@pytest.fixture
def serving(
    live_server: Any, github: FakeGitHub, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    settings.GANTRY_LOG_DIR = str(tmp_path / "logs")
    settings.GANTRY_S3_BUCKET = ""
    # Quick status and live-log ticks for the runner; a backstop tick far beyond this test's waits.
    quick = dataclasses.replace(conf.get(), status_interval=1, live_log_interval=1, dispatch_interval=600)
    monkeypatch.setattr(conf, "get", lambda: quick)
    monkeypatch.setenv("GANTRY_PUBLIC_URL", live_server.url)
    conf.github.cache_clear()
    github.actions = True
    github.variables = {"GANTRY_OIDC_AUDIENCE": AUDIENCE}
    github.actions_env = {"GANTRY_STOP_GRACE": "3"}
    return str(live_server.url)


@pytest.fixture
def dispatcher_thread(serving: str) -> Iterator[threading.Event]:
    stop = threading.Event()

    def loop() -> None:
        try:
            Dispatcher().run(stop)
        finally:
            connections.close_all()

    thread = threading.Thread(target=loop, name="dispatcher", daemon=True)
    thread.start()
    yield stop
    stop.set()
    from gantry.dispatch import longpoll

    longpoll.wake_listener()
    thread.join(30)
    assert not thread.is_alive(), "the dispatcher loop did not stop"


@pytest.mark.django_db(transaction=True)
def test_a_queued_run_succeeds_on_a_workflow_run_with_its_log(
    acme: Organization, teammate: User, github: FakeGitHub, dispatcher_thread: threading.Event
) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1000)
    gha_group(acme)
    stack = gha_stack(acme, "app")
    spec = {
        "steps": [
            {"name": "hello", "run": 'echo "hello from $WHO"'},
            {"name": "count", "run": "for i in 1 2 3; do echo tick $i; done"},
            # No step sees a credential, nor the means to get one (the job's OIDC request variables).
            {"name": "secrets", "run": "echo leaked=$(env | grep -c -E 'ACTIONS_ID_TOKEN|RUNNER_TOKEN|OIDC' || true)"},
        ],
        "env": {"WHO": "actions"},
    }

    deployment = services.deployment_create(stack=stack, spec=spec)
    run = Run.objects.get(deployment=deployment)
    assert run.status == RunStatus.PENDING

    wait_until(lambda: Run.objects.get(id=run.id).status in (RunStatus.SUCCEEDED, RunStatus.FAILURE), 180,
               "the run to finish", github)  # fmt: skip

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.failure_reason
    assert run.exit_code == 0
    kinds = [e.kind for e in run.events.all()]
    assert kinds[:3] == ["created", "assigned", "accepted"]
    assert kinds[-1] == "finished"
    # The log, read back through the API as a user would.
    token, _ = Token.objects.get_or_create(user=teammate)
    user = APIClient()
    user.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    log = user.get(f"/api/v1/runs/{run.id}/logs").json()
    assert log["complete"] is True
    assert "hello from actions\n" in log["text"]
    assert "tick 1\ntick 2\ntick 3\n" in log["text"]
    assert "leaked=0\n" in log["text"]
    # GitHub's side: one workflow run, dispatched with the three inputs, finished well.
    (workflow_run,) = github.runs.values()
    assert set(workflow_run.inputs) == {"gantry_url", "run_id", "runner_id", "correlation"}
    assert workflow_run.inputs["correlation"] == ""
    wait_until(lambda: workflow_run.status == "completed", 30, "the job to end", github)
    assert workflow_run.conclusion == "success"
    assert workflow_run.log is not None
    assert "runner.oidc_exchanged" in workflow_run.log.read_text()
    # The runner deregistered: nothing is left in flight.
    assert not Runner.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_without_run_details_the_correlation_input_finds_the_run(
    acme: Organization, github: FakeGitHub, dispatcher_thread: threading.Event
) -> None:
    # A GitHub Enterprise Server that does not know return_run_details.
    github.run_details = "refuse"
    services.org_set_runs_per_hour_limit(org=acme, limit=1000)
    gha_group(acme)
    deployment = services.deployment_create(stack=gha_stack(acme, "app"))
    run = Run.objects.get(deployment=deployment)

    wait_until(lambda: Run.objects.get(id=run.id).status in (RunStatus.SUCCEEDED, RunStatus.FAILURE), 180,
               "the run to finish", github)  # fmt: skip

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.failure_reason
    (body,) = github.dispatches  # the refused dispatch created nothing
    assert "return_run_details" not in body
    assert body["inputs"]["correlation"]
    (workflow_run,) = github.runs.values()
    assert body["inputs"]["correlation"] in workflow_run.display_title
