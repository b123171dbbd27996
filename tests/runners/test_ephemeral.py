"""``python -m runners.ephemeral`` as a real process against ``live_server`` (docs/runners.md).

Each test queues a run, claims it the way a poll does, and starts the runner
with the claim's credentials; then it judges the run's row, its events, the
log read back through the API, and the runner's exit code and log lines.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gantry import conf
from gantry.core import services
from gantry.core.models import Deployment, Run, RunEvent, Runner, RunStatus
from runners.client import GantryClient
from tests.runners.conftest import RunnerProcess, Site, start_runner, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def read_log(site: Site, run_id: Any) -> dict[str, Any]:
    """The whole log through GET /runs/{id}/logs, following next_offset until it is final."""
    client = GantryClient(site.url, site.user_token, scheme="Token")
    text, offset, pages = "", 0, 0
    while True:
        page = client.run_logs(str(run_id), offset=offset)
        text += page["text"]
        offset = page["next_offset"]
        pages += 1
        if page["final"]:
            return {"text": text, "pages": pages, "complete": page["complete"]}
        assert pages < 10_000


def events(run: Run) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run.id).order_by("at", "id").values_list("kind", flat=True))


def launch(site: Site, runners: list[RunnerProcess], spec: dict[str, Any], **env: str) -> tuple[Run, RunnerProcess]:
    run = site.deploy(spec)
    got = site.claim()
    assert got.run_id == run.id
    runner = start_runner(site, got, **env)
    runners.append(runner)
    return run, runner


def group_gone(pgid: int) -> bool:
    """No process of the group is left, after a moment: init reaps the killed orphans asynchronously."""

    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, 10, f"process group {pgid} to be gone")
    return True


def test_it_runs_the_steps_and_reports_success(site: Site, runners: list[RunnerProcess]) -> None:
    spec = {
        "steps": [
            {"name": "greet", "run": 'echo "hello $GREETING"; echo to-stderr >&2'},
            {
                "name": "env",
                "run": 'echo "run=$GANTRY_RUN_ID key=$API_KEY token=${#GANTRY_RUN_TOKEN} '
                'runner=${GANTRY_RUNNER_TOKEN:-absent}"; pwd; touch made-here',
            },
            {"name": "same folder", "run": "ls made-here"},
        ],
        "env": {"GREETING": "world"},
        "timeout_seconds": 60,
    }
    run, runner = launch(site, runners, spec)

    assert runner.wait(60) == 0
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert run.exit_code == 0
    assert not Runner.objects.filter(id=run.id).exists()
    assert Runner.objects.filter(runner_group=site.group).count() == 0  # deregistered
    assert events(run)[-1] == "finished"
    assert run.log_manifest is not None
    assert run.log_manifest["count"] == run.sealed_chunks >= 1

    text = read_log(site, run.id)["text"]
    lines = text.splitlines()
    assert lines[0] == "==> [1/3] greet"
    assert "hello world" in lines
    assert "to-stderr" in lines
    assert lines[3].startswith("==> [1/3] greet: exit code 0")
    # The run's id, the stack's secret and the run API token reach the step; the runner token never does.
    [env_line] = [line for line in lines if line.startswith("run=")]
    # The secret is masked in the log (runners/masking.py): the step saw it, the log shows ***.
    assert re.fullmatch(rf"run={run.id} key=\*\*\* token=[1-9][0-9]* runner=absent", env_line), env_line
    work = site.tmp / "work" / str(run.id)
    assert str(work) in lines
    assert "made-here" in lines
    assert lines[-1].startswith("==> [3/3] same folder: exit code 0")
    assert not work.exists()  # cleaned up after the run
    names = runner.event_names()
    for name in ("runner.ready", "run.accepted", "step.started", "step.finished", "log.shipped", "run.done"):
        assert name in names, names
    assert (site.tmp / f"{run.id}.exit").read_text().strip() == "0"


def test_a_printed_secret_is_masked_in_the_live_log_and_in_the_sealed_log(
    site: Site, runners: list[RunnerProcess]
) -> None:
    """An admin's deliberate `echo $SECRET`: the step sees the value, no log shows it (issue 10)."""
    services.stack_set_secrets(stack=site.stack, changes={"DEPLOY_KEY": "dk-4f9a-very-secret", "API_KEY": None})
    gate = site.tmp / "gate"
    spec = {
        "steps": [
            {
                "name": "leak",
                # The value whole, split over two lines by the shell, and base64'd; then wait to be read live.
                "run": f'echo "key=$DEPLOY_KEY"; printf "%s" "$DEPLOY_KEY" | base64; echo; '
                f"while [ ! -e {gate} ]; do sleep 0.1; done",
            }
        ]
    }
    run, runner = launch(site, runners, spec)
    client = GantryClient(site.url, site.user_token, scheme="Token")

    def live_text() -> str:
        return str(client.run_logs(str(run.id))["text"])

    wait_until(lambda: "key=" in live_text(), 30, "the live log to show the step's output")
    live = live_text()
    gate.write_text("")
    assert runner.wait(60) == 0
    sealed = read_log(site, run.id)["text"]
    for text in (live, sealed):
        assert "dk-4f9a-very-secret" not in text
        assert "ZGstNGY5YS12ZXJ5LXNlY3JldA" not in text  # its base64
        assert "key=***" in text.splitlines()


def test_the_token_can_come_from_a_file_that_the_runner_removes(site: Site, runners: list[RunnerProcess]) -> None:
    token_file = site.tmp / "runner-token"
    run = site.deploy({"steps": [{"name": "look", "run": f"test -e {token_file} || echo token-file-gone"}]})
    got = site.claim()
    token_file.write_text(got.runner_token + "\n")
    runner = start_runner(site, got, GANTRY_RUNNER_TOKEN="", GANTRY_RUNNER_TOKEN_FILE=str(token_file))
    runners.append(runner)

    assert runner.wait(60) == 0
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert not token_file.exists()
    assert "token-file-gone" in read_log(site, run.id)["text"].splitlines()


def test_a_step_exec_cannot_start_fails_the_run_with_the_reason(site: Site, runners: list[RunnerProcess]) -> None:
    """A step over the kernel's argument limit (E2BIG): reported through done, never a crashed runner (issue 10).

    The API refuses such a step now (specs.MAX_RUN_BYTES); a spec stored before
    the cap still reaches a runner, so it is written straight into the row here.
    """
    run = site.deploy({"steps": [{"name": "huge", "run": "true"}]})
    Deployment.objects.filter(id=run.deployment_id).update(
        spec={"steps": [{"name": "huge", "run": "echo " + "x" * 200_000}], "env": {}, "timeout_seconds": 60}
    )
    got = site.claim()
    runner = start_runner(site, got)
    runners.append(runner)

    assert runner.wait(60) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert run.exit_code == 126
    assert "could not be started" in run.failure_reason
    assert "Argument list too long" in run.failure_reason
    assert "runner.crashed" not in runner.event_names()
    assert "could not be started" in read_log(site, run.id)["text"]


def test_a_failing_step_fails_the_run_with_its_exit_code(site: Site, runners: list[RunnerProcess]) -> None:
    spec = {"steps": [{"name": "breaks", "run": "echo before; exit 3"}, {"name": "never", "run": "echo never"}]}
    run, runner = launch(site, runners, spec)

    assert runner.wait(60) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert run.exit_code == 3
    assert "step 1 (breaks) exited with code 3" in run.failure_reason
    text = read_log(site, run.id)["text"]
    assert "before\n==> [1/2] breaks: exit code 3" in text
    assert "never" not in text


def test_a_run_over_its_timeout_is_killed_and_fails(site: Site, runners: list[RunnerProcess]) -> None:
    pidfile = site.tmp / "step.pid"
    spec = {
        "steps": [{"name": "slow", "run": f"echo $$ > {pidfile}; echo started; sleep 120 & wait"}],
        "timeout_seconds": 2,
    }
    run, runner = launch(site, runners, spec)

    assert runner.wait(60) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert run.exit_code == 124
    assert "timed out after 2s" in run.failure_reason
    assert group_gone(int(pidfile.read_text()))  # the step's whole group, the background sleep too
    text = read_log(site, run.id)["text"]
    assert "started\n[gantry: timed out; stopping the step" in text
    assert "==> [1/1] slow: timed out after" in text


def test_cancellation_stops_the_step_acknowledges_and_reports_cancelled(
    site: Site, runners: list[RunnerProcess]
) -> None:
    pidfile = site.tmp / "step.pid"
    spec = {
        "steps": [
            # The trap shows the step got SIGTERM first (and had its grace period).
            {
                "name": "long",
                "run": f"trap 'echo got TERM; exit 143' TERM; echo $$ > {pidfile}; while true; do sleep 0.1; done",
            },
            {"name": "never", "run": "echo never"},
        ]
    }
    run, runner = launch(site, runners, spec)
    wait_until(pidfile.exists, 30, "the step to start")

    services.run_request_cancellation(run_id=run.id)
    assert runner.wait(60) == 0
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert group_gone(int(pidfile.read_text()))
    kinds = events(run)
    assert kinds[-3:] == ["cancel_requested", "cancel_acknowledged", "finished"]
    text = read_log(site, run.id)["text"]
    assert "[gantry: cancelled; stopping the step" in text
    assert "got TERM" in text
    assert "never" not in text
    assert "run.cancel_acknowledged" in runner.event_names()


def test_a_run_skipped_while_the_runner_booted_is_benign(site: Site, runners: list[RunnerProcess]) -> None:
    run = site.deploy({"steps": [{"name": "x", "run": "echo x"}]})
    got = site.claim()
    services.deployment_skip(deployment_id=run.deployment_id)
    runner = start_runner(site, got)
    runners.append(runner)

    assert runner.wait(60) == 0
    assert "run.already_terminal" in runner.event_names()
    assert not Runner.objects.filter(id=got.runner_id).exists()
    run.refresh_from_db()
    assert run.status == RunStatus.DISCARDED


def test_a_runner_arriving_after_its_lease_lapsed_is_refused_and_exits_1(
    site: Site, runners: list[RunnerProcess]
) -> None:
    run = site.deploy({"steps": [{"name": "x", "run": "echo x"}]})
    got = site.claim()
    services.run_reset_lease(run_id=run.id, now=got.assigned_expires_at + timedelta(seconds=1))
    runner = start_runner(site, got)
    runners.append(runner)

    assert runner.wait(60) == 1
    refused = [e for e in runner.events() if e.get("event") == "run.accept_refused"]
    assert refused
    assert refused[0]["code"] == "conflict"
    assert not Runner.objects.filter(id=got.runner_id).exists()  # deregistered: the run is free again
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    assert run.assigned_runner_id is None


def test_sigterm_to_the_runner_stops_the_step_and_fails_the_run(site: Site, runners: list[RunnerProcess]) -> None:
    pidfile = site.tmp / "step.pid"
    run, runner = launch(site, runners, {"steps": [{"name": "s", "run": f"echo $$ > {pidfile}; sleep 120"}]})
    wait_until(pidfile.exists, 30, "the step to start")

    runner.proc.send_signal(signal.SIGTERM)
    assert runner.wait(60) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert "stopped (SIGTERM)" in run.failure_reason
    assert group_gone(int(pidfile.read_text()))


def test_a_few_mib_of_output_come_back_whole_in_several_chunks(site: Site, runners: list[RunnerProcess]) -> None:
    lines = 500_000  # 7 bytes each: 3.3 MiB, four chunks
    run, runner = launch(site, runners, {"steps": [{"name": "count", "run": f"seq -w 1 {lines}"}]})

    assert runner.wait(120) == 0
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert run.log_manifest["count"] == 4
    text = read_log(site, run.id)["text"]
    body = text.split("\n", 1)[1].rsplit("==> [1/1]", 1)[0]
    assert body == "".join(f"{i:06d}\n" for i in range(1, lines + 1))
    chunks = sorted(Path(site.tmp / "logs").rglob("*.gz"))
    assert len(chunks) == 4


def test_a_log_over_max_bytes_ends_with_one_truncation_line(
    site: Site, runners: list[RunnerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    small = dataclasses.replace(conf.get(), log_max_bytes=4096)
    monkeypatch.setattr(conf, "get", lambda: small)
    run, runner = launch(site, runners, {"steps": [{"name": "chatty", "run": "seq 1 100000; echo after"}]})

    assert runner.wait(60) == 0  # the step still runs to its end: its output is drained, not recorded
    text = read_log(site, run.id)["text"]
    assert len(text.encode()) <= 4096
    assert text.endswith("[gantry: log truncated at 4096 bytes (GANTRY_LOG_MAX_BYTES)]\n")
    assert text.count("log truncated") == 1
    assert "after" not in text


def test_a_run_ended_on_the_server_stops_the_runner_without_a_report(site: Site, runners: list[RunnerProcess]) -> None:
    pidfile = site.tmp / "step.pid"
    run, runner = launch(site, runners, {"steps": [{"name": "s", "run": f"echo $$ > {pidfile}; sleep 120"}]})
    wait_until(pidfile.exists, 30, "the step to start")

    services.run_fail(run_id=run.id, reason="failed by an operator")  # as a reaper or force-delete would
    assert runner.wait(60) == 1
    assert group_gone(int(pidfile.read_text()))
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert run.failure_reason == "failed by an operator"  # the runner did not overwrite it
    assert events(run).count("finished") == 0
    assert "run.lost" in runner.event_names()
    assert not Runner.objects.filter(runner_group=site.group).exists()  # deregistered all the same
