"""How Gantry authenticates to GitHub: a GitHub App (installation per repository, access token cached),
or a token; and GitHub Enterprise Server answers without run details."""

from __future__ import annotations

import pytest

from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch.dispatcher import Dispatcher
from tests.github.conftest import OWNER, REPO, gha_group, pending_runs
from tests.github.fakes import FakeGitHub

pytestmark = pytest.mark.django_db


def test_app_mode_finds_the_installation_and_reuses_its_access_token(
    acme: Organization, github_app: FakeGitHub
) -> None:
    gha_group(acme)
    pending_runs(acme, 3)
    dispatcher = Dispatcher()

    assert dispatcher.tick().launched == 3
    pending_runs(acme, 2, prefix="later")
    assert dispatcher.tick().launched == 2

    assert github_app.installation_lookups == 1  # the repository's installation, asked once
    assert github_app.access_token_requests == 1  # one token, used until shortly before it expires
    assert len(github_app.dispatches) == 5
    assert ("GET", f"/repos/{OWNER}/{REPO}/installation") in github_app.requests


def test_app_not_installed_on_the_repository_fails_the_dispatch_saying_so(
    acme: Organization, github_app: FakeGitHub
) -> None:
    group = gha_group(acme, github_repo="elsewhere")
    (run,) = pending_runs(acme, 1)

    Dispatcher().tick()

    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert "the GitHub App is not installed on acme-inc/elsewhere" in run.failure_reason
    assert "not installed" in RunnerGroup.objects.get(id=group.id).last_dispatch_error


def test_refused_credentials_are_a_definitive_failure(acme: Organization, github: FakeGitHub) -> None:
    github.token = "another-token"  # GitHub no longer accepts Gantry's
    gha_group(acme)
    (run,) = pending_runs(acme, 1)

    Dispatcher().tick()

    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert "401" in run.failure_reason
    assert "Bad credentials" in run.failure_reason


def test_a_server_that_ignores_return_run_details_finds_the_run_by_its_name(
    acme: Organization, github: FakeGitHub
) -> None:
    github.run_details = "ignore"  # 204, no body: the parameter is silently dropped
    gha_group(acme)
    first, second = pending_runs(acme, 2)

    Dispatcher().tick()

    for run in (first, second):
        runner = Runner.objects.get(id=Run.objects.get(id=run.id).assigned_runner_id)
        assert runner.workflow_run_id in github.runs
        assert str(runner.id) in github.runs[runner.workflow_run_id].display_title
    # From then on dispatches there carry the correlation input at once.
    assert "return_run_details" in github.dispatches[0]
    assert "correlation" in github.dispatches[1]["inputs"]
    assert "return_run_details" not in github.dispatches[1]
    runner = Runner.objects.get(id=Run.objects.get(id=second.id).assigned_runner_id)
    assert runner.dispatch_correlation_sha256 != ""
    assert github.dispatches[1]["inputs"]["correlation"] not in runner.dispatch_correlation_sha256


def test_the_launcher_interface_reads_and_cancels_workflow_runs(github: FakeGitHub) -> None:
    import launchers
    from gantry import conf
    from launchers.github_actions.api import GitHubApi

    cfg = conf.github()
    launcher = launchers.get("github_actions")(
        api=GitHubApi(api_url=cfg.api_url, token=cfg.token), owner=OWNER, repo=REPO, workflow="gantry-runner.yml",
        ref="main",
    )  # fmt: skip
    assignment = launchers.Assignment(server="http://127.0.0.1:9", run_id="r-1", runner_id="n-1", runner_token="")

    handle = launcher.launch(assignment)

    assert handle.kind == "github_actions"
    assert int(handle.ident) in github.runs
    assert launcher.is_alive(handle)  # GET /actions/runs/{id}: queued
    assert launcher.discover() == []  # Gantry's runner rows are the record, not GitHub
    launcher.terminate(handle)
    assert github.cancels == [int(handle.ident)]
    assert not launcher.is_alive(handle)  # completed (cancelled)
    launcher.terminate(handle)  # cancelling a finished run is no failure (GitHub's 409)
