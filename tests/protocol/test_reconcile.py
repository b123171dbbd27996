"""``POST /runner-groups/reconcile``: the rules for exited and running workers, the binding, the refusals.

The rules are driven through the service with explicit times (each "no
longer needs it" case, each exited case, replays); the route is driven over
HTTP for what only the route can show: who may call it, what a malformed or
oversized report gets, and the answer's shape.
"""

from __future__ import annotations

import gzip
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import Organization, RunEvent, Runner, RunnerGroup, RunStatus, Stack
from gantry.logs import live
from gantry.logs.reader import lost_line, read_log
from gantry.reapers import reconcile as settle
from gantry.reapers.reconcile import WorkerReport
from tests.core.drive import Driven, deploy, drive, event_kinds, lease, reload
from tests.reapers.helpers import world

URL = "/api/v1/runner-groups/reconcile"


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def group_api(group: RunnerGroup) -> APIClient:
    return bearer(tokens.mint_group_token(group_id=group.id, token_version=group.token_version))


def report(d: Driven, state: str, **extra: Any) -> WorkerReport:
    assert d.runner is not None
    return WorkerReport(run_id=d.run.id, runner_id=d.runner.id, state=state, **extra)


def reconcile(group: RunnerGroup, *workers: WorkerReport, now: datetime) -> settle.Reconciled:
    return settle.group_reconcile(group=group, workers=list(workers), now=now)


def stops(result: settle.Reconciled) -> list[tuple[uuid.UUID, str, str | None]]:
    return [(order.run_id, order.reason, order.run_status) for order in result.stop]


@pytest.fixture(autouse=True)
def log_dir(tmp_path: Path, settings: Any) -> Path:
    settings.GANTRY_LOG_DIR = str(tmp_path / "logs")
    settings.GANTRY_S3_BUCKET = ""
    return tmp_path / "logs"


@pytest.fixture
def other_group(globex: Organization) -> RunnerGroup:
    group, _ = services.runner_group_create(org=globex, name="theirs", labels={"os": "linux"})
    return group


@pytest.fixture
def other_stack(globex: Organization) -> Stack:
    return services.stack_create(org=globex, name="theirs", spec={"steps": [{"name": "x", "run": "true"}]})


# ---------------------------------------------------------------- exited workers


def test_an_exited_worker_fails_its_executing_run_at_once_and_keeps_its_log(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running")
    queued = deploy(stack, now=d.now)
    assert queued.status == RunStatus.QUEUED
    live.store(d.run.id, chunk_index=0, sealed_chunks=0, data=gzip.compress(b"line one\nline two\n"))
    now = d.now + timedelta(seconds=5)

    result = reconcile(
        group,
        report(d, "exited", exit_code=-9, last_lines=['{"event": "step.started"}', "bye"], seconds=4.2),
        now=now,
    )

    run = reload(d.run)
    assert run.status == RunStatus.FAILURE
    assert run.finished_at == now
    assert run.failure_reason.startswith("runner lost: the worker was killed by signal 9 after 4.2 s")
    assert run.failure_reason.endswith('its last lines:\n{"event": "step.started"}\nbye')
    assert event_kinds(d.run)[-1] == "runner_exited"
    detail = RunEvent.objects.filter(run_id=d.run.id, kind="runner_exited").get().detail
    assert detail == {"runner_id": str(d.runner.id), "exit_code": -9, "seconds": 4.2}  # type: ignore[union-attr]
    assert not Runner.objects.filter(id=d.runner.id).exists()  # type: ignore[union-attr]
    assert reload(queued).status == RunStatus.PENDING  # the lane moved on
    # The live record became the log's final chunk.
    assert run.log_manifest is not None
    assert run.log_manifest["count"] == 1
    assert live.get(d.run.id) is None
    # ...followed by the line saying the rest (after the last live push) is lost.
    assert read_log(run, offset=0).text == "line one\nline two\n" + lost_line().decode()
    assert result.failed == [d.run.id]
    assert result.stop == []
    assert result.retry == []
    assert result.deleted == 1


def test_a_replayed_exited_report_changes_nothing(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running")
    exited = report(d, "exited", exit_code=1)
    reconcile(group, exited, now=d.now + timedelta(seconds=1))
    before = world()

    again = reconcile(group, exited, now=d.now + timedelta(seconds=2))

    assert world() == before
    assert again.failed == []
    assert again.stop == []
    assert again.deleted == 0
    assert again.ignored == 0


@pytest.mark.parametrize("state", ["requested_cancellation", "cancelling"])
def test_an_exited_worker_fails_a_run_it_was_cancelling(stack: Stack, group: RunnerGroup, state: str) -> None:
    d = drive(stack, group, state)
    reconcile(group, report(d, "exited", exit_code=None), now=d.now + timedelta(seconds=1))
    run = reload(d.run)
    assert run.status == RunStatus.FAILURE
    assert "the worker exited with an unknown code" in run.failure_reason


def test_a_worker_that_exited_before_it_accepted_fails_the_run_as_a_dispatch_failure(
    stack: Stack, group: RunnerGroup
) -> None:
    d = drive(stack, group, "assigned")
    reconcile(group, report(d, "exited", exit_code=3, last_lines=["server unreachable"]), now=d.now)

    run = reload(d.run)
    assert run.status == RunStatus.FAILURE
    assert run.failure_reason.startswith("dispatch failed: the worker exited with code 3 before it accepted the run")
    assert "server unreachable" in run.failure_reason
    assert event_kinds(d.run)[-1] == "dispatch_failed"
    assert not Runner.objects.filter(id=d.runner.id).exists()  # type: ignore[union-attr]
    assert "exited with code 3" in RunnerGroup.objects.get(id=group.id).last_dispatch_error


def test_a_worker_that_exited_after_its_lease_lapsed_releases_the_run_for_another_runner(
    stack: Stack, group: RunnerGroup
) -> None:
    d = drive(stack, group, "assigned")
    later = d.now + lease() + timedelta(seconds=1)
    services.run_reset_lease(run_id=d.run.id, now=later)

    reconcile(group, report(d, "exited", exit_code=1), now=later)

    run = reload(d.run)
    assert run.status == RunStatus.PENDING
    assert run.assigned_runner_id is None
    assert not Runner.objects.filter(id=d.runner.id).exists()  # type: ignore[union-attr]


def test_an_exited_worker_of_a_finished_run_is_deregistered(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "succeeded")
    before = reload(d.run)
    result = reconcile(group, report(d, "exited", exit_code=0), now=d.now)
    assert not Runner.objects.filter(id=d.runner.id).exists()  # type: ignore[union-attr]
    assert reload(d.run).status == RunStatus.SUCCEEDED
    assert reload(d.run).updated_at == before.updated_at
    assert result.failed == []
    assert result.deleted == 1


def test_a_failed_flush_keeps_the_runner_row_and_asks_for_the_report_again(
    stack: Stack, group: RunnerGroup, settings: Any, tmp_path: Path
) -> None:
    d = drive(stack, group, "running")
    live.store(d.run.id, chunk_index=0, sealed_chunks=0, data=gzip.compress(b"kept\n"))
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("log storage cannot write under a file")
    settings.GANTRY_LOG_DIR = str(blocked)
    exited = report(d, "exited", exit_code=-9)

    first = reconcile(group, exited, now=d.now + timedelta(seconds=1))

    assert reload(d.run).status == RunStatus.FAILURE  # failed at once all the same
    assert first.retry == [exited]
    assert Runner.objects.filter(id=d.runner.id).exists()  # type: ignore[union-attr]
    assert live.get(d.run.id) is not None  # nothing lost

    settings.GANTRY_LOG_DIR = str(tmp_path / "logs")
    second = reconcile(group, exited, now=d.now + timedelta(seconds=2))

    assert second.retry == []
    assert second.deleted == 1
    run = reload(d.run)
    assert read_log(run, offset=0).text == "kept\n" + lost_line().decode()
    assert event_kinds(d.run).count("runner_exited") == 1


# ---------------------------------------------------------------- running workers


def test_a_worker_whose_run_still_needs_it_is_left_alone(stack: Stack, group: RunnerGroup, acme: Any) -> None:
    starting = drive(stack, group, "assigned")
    other = services.stack_create(org=acme, name="second", labels=stack.labels, spec=stack.spec)
    running = drive(other, group, "running", now=starting.now)
    before = world()

    result = reconcile(group, report(starting, "running"), report(running, "running"), now=running.now)

    assert result.stop == []
    assert result.ignored == 0
    assert world() == before  # a running worker's report only reads


@pytest.mark.parametrize(
    ("recipe", "status"),
    [
        ("cancelled_before_start", RunStatus.CANCELLED),
        ("discarded", RunStatus.DISCARDED),
        ("succeeded", RunStatus.SUCCEEDED),
        ("failure_by_fail", RunStatus.FAILURE),
        ("startup_timeout", RunStatus.STARTUP_TIMEOUT),
    ],
)
def test_a_worker_whose_run_ended_without_it_is_told_to_stop(
    stack: Stack, group: RunnerGroup, recipe: str, status: str
) -> None:
    d = drive(stack, group, recipe)
    before = world()
    result = reconcile(group, report(d, "running"), now=d.now)
    assert stops(result) == [(d.run.id, settle.STOP_RUN_TERMINAL, status)]
    assert world() == before


@pytest.mark.parametrize("reset", [False, True], ids=["lease-past-expiry", "lease-reset"])
def test_a_worker_whose_lease_lapsed_is_told_to_stop(stack: Stack, group: RunnerGroup, reset: bool) -> None:
    d = drive(stack, group, "assigned")
    later = d.now + lease() + timedelta(seconds=1)
    if reset:
        services.run_reset_lease(run_id=d.run.id, now=later)
    result = reconcile(group, report(d, "running"), now=later)
    expected = RunStatus.PENDING if reset else RunStatus.ASSIGNED
    assert stops(result) == [(d.run.id, settle.STOP_LEASE_LAPSED, expected)]


def test_a_worker_whose_run_went_to_another_runner_is_told_to_stop(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned")
    later = d.now + lease() + timedelta(seconds=1)
    services.run_reset_lease(run_id=d.run.id, now=later)
    Runner.objects.filter(id=d.runner.id).delete()  # type: ignore[union-attr]  # the stub reaper's delete
    successor = Runner.objects.create(runner_group=group)
    services.run_assign(run_id=d.run.id, runner=successor, now=later)

    result = reconcile(group, report(d, "running"), now=later)

    assert stops(result) == [(d.run.id, settle.STOP_RUNNER_GONE, RunStatus.ASSIGNED)]
    assert reload(d.run).assigned_runner_id == successor.id  # the new runner's claim is untouched


def test_a_worker_whose_runner_was_force_deleted_is_told_to_stop(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running")
    services.runner_force_delete(runner_id=d.runner.id, now=d.now + timedelta(days=1))  # type: ignore[union-attr]
    result = reconcile(group, report(d, "running"), now=d.now + timedelta(days=1))
    assert stops(result) == [(d.run.id, settle.STOP_RUNNER_GONE, RunStatus.FAILURE)]


# ---------------------------------------------------------------- the binding


def test_a_group_cannot_speak_of_another_groups_runners(
    stack: Stack, group: RunnerGroup, other_stack: Stack, other_group: RunnerGroup
) -> None:
    theirs = drive(other_stack, other_group, "running")
    before = world()

    result = reconcile(group, report(theirs, "exited", exit_code=-9), report(theirs, "running"), now=theirs.now)

    assert world() == before  # their run still runs, their runner row is still there
    assert result.stop == []
    assert result.failed == []
    assert result.ignored == 2


def test_a_group_cannot_stop_another_groups_worker_whose_runner_is_gone(
    other_stack: Stack, other_group: RunnerGroup, group: RunnerGroup
) -> None:
    theirs = drive(other_stack, other_group, "running")
    services.runner_force_delete(runner_id=theirs.runner.id, now=theirs.now + timedelta(days=1))  # type: ignore[union-attr]
    result = reconcile(group, report(theirs, "running"), now=theirs.now + timedelta(days=1))
    # Their coordinator would be told to stop; ours learns nothing, as for an unknown id.
    assert result.stop == []
    assert result.ignored == 1
    assert stops(reconcile(other_group, report(theirs, "running"), now=theirs.now)) == [
        (theirs.run.id, settle.STOP_RUNNER_GONE, RunStatus.FAILURE)
    ]


def test_an_entry_pairing_a_runner_with_a_run_not_bound_to_it_is_ignored(
    stack: Stack, group: RunnerGroup, acme: Any
) -> None:
    mine = drive(stack, group, "running")
    other = services.stack_create(org=acme, name="second", labels=stack.labels, spec=stack.spec)
    sibling = drive(other, group, "running", now=mine.now)
    before = world()
    crossed = WorkerReport(run_id=sibling.run.id, runner_id=mine.runner.id, state="exited", exit_code=1)  # type: ignore[union-attr]
    unknown = WorkerReport(run_id=uuid.uuid4(), runner_id=uuid.uuid4(), state="running")

    result = reconcile(group, crossed, unknown, now=mine.now)

    assert world() == before
    assert result.stop == []
    assert result.ignored == 2


# ---------------------------------------------------------------- the route


def _executing(stack: Stack, group: RunnerGroup) -> Driven:
    from django.utils import timezone

    return drive(stack, group, "running", now=timezone.now() - timedelta(seconds=10))


def test_the_route_answers_stop_orders_and_settles_exits(stack: Stack, group: RunnerGroup, acme: Any) -> None:
    from django.utils import timezone

    running = _executing(stack, group)
    other = services.stack_create(org=acme, name="second", labels=stack.labels, spec=stack.spec)
    cancelled = drive(other, group, "cancelled_before_start", now=timezone.now() - timedelta(seconds=10))
    body = {
        "workers": [
            {"run_id": str(running.run.id), "runner_id": str(running.runner.id), "state": "exited",  # type: ignore[union-attr]
             "exit_code": 137, "last_lines": ["  indented line"], "seconds": 12.5},
            {"run_id": str(cancelled.run.id), "runner_id": str(cancelled.runner.id), "state": "running"},  # type: ignore[union-attr]
        ]
    }  # fmt: skip

    response = group_api(group).post(URL, body, format="json")

    assert response.status_code == 200, response.content
    assert response.json() == {
        "stop": [
            {
                "run_id": str(cancelled.run.id),
                "runner_id": str(cancelled.runner.id),  # type: ignore[union-attr]
                "reason": "run_terminal",
                "run_status": "cancelled",
            }
        ],
        "retry": [],
    }
    run = reload(running.run)
    assert run.status == RunStatus.FAILURE
    assert "exited with code 137 after 12.5 s" in run.failure_reason
    assert run.failure_reason.endswith("\n  indented line")  # lines kept as the worker wrote them
    assert group_api(group).post(URL, {"workers": []}, format="json").json() == {"stop": [], "retry": []}


def test_the_route_takes_only_a_group_token(stack: Stack, group: RunnerGroup, teammate: Any) -> None:
    d = _executing(stack, group)
    runner_token = tokens.mint_runner_token(runner_id=d.runner.id, run_id=d.run.id, group_id=group.id)  # type: ignore[union-attr]
    body = {"workers": [{"run_id": str(d.run.id), "runner_id": str(d.runner.id), "state": "exited"}]}  # type: ignore[union-attr]
    from rest_framework.authtoken.models import Token

    user = APIClient()
    user.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=teammate).key}")
    before = world()

    assert bearer(runner_token).post(URL, body, format="json").status_code == 403
    assert user.post(URL, body, format="json").status_code == 403
    assert APIClient().post(URL, body, format="json").status_code == 401
    assert bearer("not-a-jwt").post(URL, body, format="json").status_code == 401
    assert world() == before


def _entry(**fields: Any) -> dict[str, Any]:
    return {"run_id": str(uuid.uuid4()), "runner_id": str(uuid.uuid4()), "state": "running", **fields}


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"workers": "all"},
        {"workers": [{"run_id": "nope", "runner_id": str(uuid.uuid4()), "state": "running"}]},
        {"workers": [_entry(state="lost")]},
        {"workers": [_entry(exit_code="nine")]},
        {"workers": [_entry(seconds=-1)]},
        {"workers": [_entry(last_lines="one string")]},
        {"workers": [_entry(last_lines=["x" * 1001])]},
        {"workers": [_entry(last_lines=["x"] * 51)]},
        {"workers": [_entry(run_id="5b0b7a0e-0000-4000-8000-000000000001")] * 2},
        {"workers": [_entry() for _ in range(1001)]},
    ],
    ids=[
        "not-an-object",
        "no-workers",
        "workers-not-a-list",
        "bad-uuid",
        "bad-state",
        "bad-exit-code",
        "negative-seconds",
        "lines-not-a-list",
        "line-too-long",
        "too-many-lines",
        "listed-twice",
        "too-many-workers",
    ],
)
def test_a_malformed_report_is_refused_and_changes_nothing(stack: Stack, group: RunnerGroup, body: Any) -> None:
    d = _executing(stack, group)
    before = world()
    if isinstance(body, dict) and body.get("workers") and isinstance(body["workers"], list):
        # Make the report otherwise actionable: the real runner exited.
        body["workers"] = [*body["workers"], {"run_id": str(d.run.id), "runner_id": str(d.runner.id),  # type: ignore[union-attr]
                                              "state": "exited", "exit_code": 1}]  # fmt: skip
    response = group_api(group).post(URL, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_request"
    assert world() == before
    assert reload(d.run).status == RunStatus.RUNNING


def test_a_report_of_the_limit_is_taken(group: RunnerGroup) -> None:
    response = group_api(group).post(URL, {"workers": [_entry() for _ in range(1000)]}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"stop": [], "retry": []}
