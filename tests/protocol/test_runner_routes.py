"""The two-phase protocol over HTTP: poll, ready, accept, status, cancel, done, deregister, dispatch-failed.

Each failure window of the reference is driven for real: a lost accept answer
retried, a lease lapsing while the runner boots, a runner deregistering after
its run was skipped, two runners racing to accept.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import Deployment, Organization, Run, Runner, RunnerGroup, RunToken, Stack

from ..conftest import SPEC


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


class Coordinator:
    """A runner group's view of the API."""

    def __init__(self, group: RunnerGroup) -> None:
        self.group = group
        self.api = bearer(tokens.mint_group_token(group_id=group.id, token_version=group.token_version))

    def poll(self) -> dict[str, Any] | None:
        response = self.api.get("/api/v1/runner-groups/poll")
        assert response.status_code in (200, 204), response.content
        return response.json() if response.status_code == 200 else None


class EphemeralRunner:
    """One ephemeral runner, holding the credentials a poll handed out."""

    def __init__(self, claim: dict[str, Any]) -> None:
        self.run_id = claim["run_id"]
        self.runner_id = claim["runner_id"]
        self.api = bearer(claim["runner_token"])

    def ready(self, **metadata: Any) -> Any:
        return self.api.post(f"/api/v1/runners/{self.runner_id}/ready", metadata, format="json")

    def accept(self) -> Any:
        return self.api.post(f"/api/v1/runs/{self.run_id}/accept")

    def status(self) -> Any:
        return self.api.get(f"/api/v1/runs/{self.run_id}/status")

    def ack_cancel(self) -> Any:
        return self.api.post(f"/api/v1/runs/{self.run_id}/acknowledging-cancel")

    def done(self, outcome: str = "succeeded", exit_code: int | None = 0, **extra: Any) -> Any:
        body = {"outcome": outcome, "exit_code": exit_code, "sealed_chunks": 0, **extra}
        return self.api.post(f"/api/v1/runs/{self.run_id}/done", body, format="json")

    def deregister(self) -> Any:
        return self.api.delete(f"/api/v1/runners/{self.runner_id}/deregister")


@pytest.fixture
def coordinator(group: RunnerGroup) -> Coordinator:
    return Coordinator(group)


def _queue(stack: Stack, n: int = 1) -> list[Run]:
    return [services.deployment_create(stack=stack).runs.get() for _ in range(n)]


def _claimed(coordinator: Coordinator, stack: Stack) -> EphemeralRunner:
    _queue(stack)
    claim = coordinator.poll()
    assert claim is not None
    return EphemeralRunner(claim)


def _run(runner: EphemeralRunner) -> Run:
    return Run.objects.get(id=runner.run_id)


def _code(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["code"]


# ---------------------------------------------------------------- poll


def test_it_answers_a_claim_with_runner_credentials(coordinator: Coordinator, stack: Stack) -> None:
    (run,) = _queue(stack)
    claim = coordinator.poll()
    assert claim is not None
    assert set(claim) == {"run_id", "runner_id", "runner_token", "assigned_expires_at"}
    assert claim["run_id"] == str(run.id)
    claims = tokens.decode(claim["runner_token"]).raw
    assert (claims["aud"], claims["sub"], claims["run"]) == ("runner", claim["runner_id"], str(run.id))
    run.refresh_from_db()
    assert (run.status, str(run.assigned_runner_id)) == ("assigned", claim["runner_id"])
    assert Runner.objects.get(id=claim["runner_id"]).status == "not_ready"
    coordinator.group.refresh_from_db()
    assert coordinator.group.last_polled_at is not None


def test_it_answers_204_when_nothing_is_claimable(coordinator: Coordinator) -> None:
    assert coordinator.poll() is None


def test_it_refuses_polls_without_a_group_token(stack: Stack, owner_api: APIClient, coordinator: Coordinator) -> None:
    _queue(stack)
    assert APIClient().get("/api/v1/runner-groups/poll").status_code == 401
    assert owner_api.get("/api/v1/runner-groups/poll").status_code == 403
    runner = _claimed(coordinator, stack)  # the first run is claimed by the group itself
    assert runner.api.get("/api/v1/runner-groups/poll").status_code == 403
    assert Run.objects.filter(status="assigned").count() == 1


# ---------------------------------------------------------------- ready


def test_it_readies_a_stub_idempotently(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    assert runner.ready(hostname="node-1", launcher="local", pid=4242).status_code == 204
    row = Runner.objects.get(id=runner.runner_id)
    assert (row.status, row.hostname, row.launcher, row.pid) == ("ready", "node-1", "local", 4242)
    first_ready_at = row.ready_at
    # The answer of the first call was lost; the runner retries: same 204, nothing moves back.
    assert runner.ready().status_code == 204
    row.refresh_from_db()
    assert (row.status, row.ready_at) == ("ready", first_ready_at)


def test_it_refuses_ready_once_the_runner_is_busy(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    runner.ready()
    assert runner.accept().status_code == 200
    assert _code(runner.ready()) == (409, "runner_busy")


# ---------------------------------------------------------------- accept


def test_it_accepts_and_answers_the_run_context(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    runner.ready()
    response = runner.accept()
    assert response.status_code == 200
    context = response.json()
    fields = {"run_id", "deployment_id", "stack_id", "spec", "secrets", "scm", "logs", "status_interval_s", "api_token"}
    assert fields <= set(context)
    assert context["spec"]["steps"] == SPEC["steps"]
    run = _run(runner)
    assert (run.status, run.started_at is not None) == ("running", True)
    assert Deployment.objects.get(id=run.deployment_id).status == "running"
    # Only the hash is kept, one token per run.
    stored = RunToken.objects.get(run=run)
    assert stored.token_sha256 == tokens.sha256_hex(context["api_token"])
    assert context["api_token"] not in stored.token_sha256


def test_it_fails_the_run_when_an_accept_answer_was_lost(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    (queued,) = _queue(stack)
    runner.ready()
    assert runner.accept().status_code == 200
    # The first answer never reached the runner; it retries.
    retry = runner.accept()
    assert _code(retry) == (409, "accept_response_undeliverable")
    run = _run(runner)
    assert run.status == "failure"
    assert Deployment.objects.get(id=run.deployment_id).status == "failed"
    # The lane is released at once: the next deployment is pending.
    queued.refresh_from_db()
    assert queued.status == "pending"
    assert RunToken.objects.get(run=run).revoked_at is not None


@pytest.mark.parametrize("how", ["skip", "cancel"])
def test_it_answers_run_already_terminal_for_a_skipped_or_cancelled_run(
    coordinator: Coordinator, stack: Stack, how: str
) -> None:
    runner = _claimed(coordinator, stack)
    run = _run(runner)
    if how == "skip":
        services.deployment_skip(deployment_id=run.deployment_id)
    else:
        services.run_request_cancellation(run_id=run.id)
    response = runner.accept()
    assert _code(response) == (409, "run_already_terminal")
    assert response.json()["status"] in ("discarded", "cancelled")
    # The runner's run was skipped under it: it may always deregister.
    assert runner.deregister().status_code == 204
    assert not Runner.objects.filter(id=runner.runner_id).exists()


def test_it_refuses_accept_once_the_lease_lapsed_while_booting(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    assert runner.ready().status_code == 204
    later = timezone.now() + timedelta(minutes=6)
    with time_machine.travel(later, tick=False):
        # Past expiry, before any reaper ran.
        response = runner.accept()
        assert _code(response) == (409, "conflict")
        assert "past expiry" in response.json()["detail"]
        services.run_reset_lease(run_id=uuid.UUID(runner.run_id), now=later)
        response = runner.accept()
        assert _code(response) == (409, "conflict")
        assert "pending" in response.json()["detail"]
        # The pointer is kept: nobody else gets the run while this runner exists.
        assert coordinator.poll() is None
        # The runner gives up and deregisters (its lease lapsed: it holds nothing).
        assert runner.deregister().status_code == 204
        second = coordinator.poll()
        assert second is not None
        assert second["run_id"] == runner.run_id
        assert EphemeralRunner(second).accept().status_code == 200
    assert _run(runner).status == "running"


@pytest.mark.parametrize("terminal", ["failure", "startup_timeout"])
def test_it_names_faulty_terminal_states_without_a_code(coordinator: Coordinator, stack: Stack, terminal: str) -> None:
    runner = _claimed(coordinator, stack)
    run_id = uuid.UUID(runner.run_id)
    if terminal == "failure":
        services.run_fail(run_id=run_id, reason="test")
    else:
        # Once the lease lapsed: a run its runner may still accept never times out.
        services.run_startup_timeout(run_id=run_id, now=timezone.now() + timedelta(minutes=6))
    response = runner.accept()
    assert _code(response) == (409, "conflict")
    assert terminal in response.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_it_lets_exactly_one_of_two_racing_runners_accept(acme: Organization, group: RunnerGroup, stack: Stack) -> None:
    coordinator = Coordinator(group)
    first = _claimed(coordinator, stack)
    later = timezone.now() + timedelta(minutes=6)
    services.run_reset_lease(run_id=uuid.UUID(first.run_id), now=later)
    # The first runner's row is gone (reaped), so the run is dispatched again.
    Runner.objects.filter(id=first.runner_id).delete()
    second_claim = coordinator.poll()
    assert second_claim is not None
    second = EphemeralRunner(second_claim)
    barrier = threading.Barrier(2)
    results: dict[str, int] = {}

    def accept(name: str, runner: EphemeralRunner) -> None:
        try:
            barrier.wait()
            results[name] = runner.accept().status_code
        finally:
            connection.close()

    threads = [threading.Thread(target=accept, args=(n, r)) for n, r in (("first", first), ("second", second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"first": 401, "second": 200}
    run = Run.objects.get(id=first.run_id)
    assert (run.status, str(run.assigned_runner_id)) == ("running", second.runner_id)
    assert RunToken.objects.filter(run=run).count() == 1


# ---------------------------------------------------------------- status, cancel, done


def test_it_refreshes_liveness_and_reports_cancellation(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    runner.ready()
    runner.accept()
    Runner.objects.filter(id=runner.runner_id).update(last_seen_at=None)
    assert runner.status().json() == {"status": "running", "cancel_requested": False}
    assert Runner.objects.get(id=runner.runner_id).last_seen_at is not None
    services.run_request_cancellation(run_id=uuid.UUID(runner.run_id))
    assert runner.status().json() == {"status": "requested_cancellation", "cancel_requested": True}
    assert runner.ack_cancel().status_code == 204
    assert runner.ack_cancel().status_code == 204  # a replay changes nothing
    assert runner.status().json() == {"status": "cancelling", "cancel_requested": True}
    assert runner.done("cancelled", exit_code=None).status_code == 204
    assert _run(runner).status == "cancelled"


def test_it_refuses_to_acknowledge_a_cancellation_nobody_asked_for(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    runner.accept()
    assert _code(runner.ack_cancel()) == (409, "invalid_transition")
    assert _run(runner).status == "running"


def test_it_finishes_promotes_and_revokes(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    (queued,) = _queue(stack)
    runner.ready()
    runner.accept()
    assert runner.done("failure", exit_code=3, error="step 1 failed").status_code == 204
    run = _run(runner)
    assert (run.status, run.exit_code, run.failure_reason) == ("failure", 3, "step 1 failed")
    assert RunToken.objects.get(run=run).revoked_at is not None
    queued.refresh_from_db()
    assert queued.status == "pending"
    # A replay of the same /done (lost answer) is accepted; a different outcome is not.
    assert runner.done("failure", exit_code=3).status_code == 204
    assert _code(runner.done("succeeded")) == (409, "run_terminal")
    # Finished: the runner may go, which frees its group slot.
    assert runner.deregister().status_code == 204


def test_a_done_replayed_with_another_exit_code_or_manifest_is_a_conflict(
    coordinator: Coordinator, stack: Stack
) -> None:
    """A replay must never quietly drop what differs (issue 10)."""
    runner = _claimed(coordinator, stack)
    runner.accept()
    assert runner.done("failure", exit_code=3, manifest={"count": 0, "sha256": []}).status_code == 204
    assert _code(runner.done("failure", exit_code=4)) == (409, "run_terminal")
    other = {"count": 1, "sha256": ["0" * 64]}
    assert _code(runner.done("failure", exit_code=3, sealed_chunks=1, manifest=other)) == (409, "run_terminal")
    run = _run(runner)
    assert (run.exit_code, run.log_manifest) == (3, {"count": 0, "sha256": []})
    assert runner.done("failure", exit_code=3, manifest={"count": 0, "sha256": []}).status_code == 204


@pytest.mark.parametrize("body", [[], [1, 2], "text", 5])
def test_runner_routes_refuse_a_body_that_is_not_an_object(coordinator: Coordinator, stack: Stack, body: Any) -> None:
    runner = _claimed(coordinator, stack)
    ready = runner.api.post(f"/api/v1/runners/{runner.runner_id}/ready", body, format="json")
    assert _code(ready) == (400, "invalid_request")
    assert Runner.objects.get(id=runner.runner_id).status == "not_ready"
    runner.accept()
    done = runner.api.post(f"/api/v1/runs/{runner.run_id}/done", body, format="json")
    assert _code(done) == (400, "invalid_request")
    assert _run(runner).status == "running"


@pytest.mark.parametrize("big", [2**40, 2**70, -(2**40)])
def test_runner_routes_refuse_integers_beyond_their_columns(coordinator: Coordinator, stack: Stack, big: int) -> None:
    runner = _claimed(coordinator, stack)
    # pid is an integer column; workflow_run_id a bigint (2**40 fits there).
    too_big = {"pid": True, "workflow_run_id": not 0 <= big < 2**63}
    for field, refused in too_big.items():
        response = runner.api.post(f"/api/v1/runners/{runner.runner_id}/ready", {field: big}, format="json")
        assert response.status_code == (400 if refused else 204), (field, response.content)
    runner.accept()
    for extra in ({"exit_code": big}, {"sealed_chunks": abs(big)}):
        body = {"outcome": "failure", "exit_code": 1, **extra}
        response = runner.api.post(f"/api/v1/runs/{runner.run_id}/done", body, format="json")
        assert _code(response) == (400, "invalid_request"), extra
    assert _run(runner).status == "running"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"outcome": "maybe"},
        {"outcome": "succeeded", "exit_code": "zero"},
        {"outcome": "failure", "sealed_chunks": -1},
    ],
)
def test_it_rejects_a_malformed_done(coordinator: Coordinator, stack: Stack, body: dict[str, Any]) -> None:
    runner = _claimed(coordinator, stack)
    runner.accept()
    response = runner.api.post(f"/api/v1/runs/{runner.run_id}/done", body, format="json")
    assert _code(response) == (400, "invalid_request")
    assert _run(runner).status == "running"


def test_it_refuses_cancelled_without_a_request(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    runner.accept()
    assert runner.done("cancelled").status_code == 409
    assert _run(runner).status == "running"


# ---------------------------------------------------------------- deregister


def test_it_refuses_deregister_only_while_the_runner_holds_its_run(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    # Assigned with an unexpired lease: it could still accept.
    assert _code(runner.deregister()) == (409, "runner_holds_run")
    runner.accept()
    assert _code(runner.deregister()) == (409, "runner_holds_run")
    services.run_request_cancellation(run_id=uuid.UUID(runner.run_id))
    assert _code(runner.deregister()) == (409, "runner_holds_run")
    runner.ack_cancel()
    assert _code(runner.deregister()) == (409, "runner_holds_run")
    runner.done("cancelled", exit_code=None)
    assert runner.deregister().status_code == 204
    assert _run(runner).assigned_runner_id is None  # released by the FK
    # The row is gone, and with it the token.
    assert runner.deregister().status_code == 401


# ---------------------------------------------------------------- dispatch-failed


def test_it_fails_the_run_when_the_group_cannot_start_a_runner(coordinator: Coordinator, stack: Stack) -> None:
    runner = _claimed(coordinator, stack)
    (queued,) = _queue(stack)
    body = {"run_id": runner.run_id, "runner_id": runner.runner_id, "error": "spawn failed: ENOMEM"}
    response = coordinator.api.post("/api/v1/runner-groups/dispatch-failed", body, format="json")
    assert response.status_code == 204
    run = _run(runner)
    assert (run.status, run.failure_reason) == ("failure", "dispatch failed: spawn failed: ENOMEM")
    assert Deployment.objects.get(id=run.deployment_id).status == "failed"
    assert not Runner.objects.filter(id=runner.runner_id).exists()
    coordinator.group.refresh_from_db()
    assert coordinator.group.last_dispatch_error == "spawn failed: ENOMEM"
    assert coordinator.group.last_dispatch_error_at is not None
    queued.refresh_from_db()
    assert queued.status == "pending"
    # Reported twice: the run is already failed, the stub gone.
    again = coordinator.api.post("/api/v1/runner-groups/dispatch-failed", body, format="json")
    assert again.status_code == 404


def test_it_refuses_dispatch_failed_for_a_started_run_or_another_group(
    coordinator: Coordinator, stack: Stack, acme: Organization
) -> None:
    runner = _claimed(coordinator, stack)
    runner.accept()
    body = {"run_id": runner.run_id, "runner_id": runner.runner_id, "error": "x"}
    response = coordinator.api.post("/api/v1/runner-groups/dispatch-failed", body, format="json")
    assert _code(response) == (409, "invalid_transition")
    _other, token = services.runner_group_create(org=acme, name="other")
    response = bearer(token).post("/api/v1/runner-groups/dispatch-failed", body, format="json")
    assert response.status_code == 404
    assert _run(runner).status == "running"
    assert Runner.objects.filter(id=runner.runner_id).exists()
    bad = coordinator.api.post("/api/v1/runner-groups/dispatch-failed", {"run_id": "nope"}, format="json")
    assert _code(bad) == (400, "invalid_request")


def test_dispatch_failed_for_a_run_the_group_does_not_hold_is_404_whatever_its_state(
    coordinator: Coordinator, stack: Stack, globex_stack: Stack, globex: Organization
) -> None:
    """A group token must not learn the status of runs it does not hold (issue 10)."""
    mine = _claimed(coordinator, stack)
    theirs_group, _token = services.runner_group_create(org=globex, name="theirs")
    theirs = Coordinator(theirs_group)
    foreign = _claimed(theirs, globex_stack)
    foreign.accept()  # running: today's answer named it
    for run_id in (foreign.run_id, str(uuid.uuid4())):
        body = {"run_id": run_id, "runner_id": mine.runner_id, "error": "x"}
        response = coordinator.api.post("/api/v1/runner-groups/dispatch-failed", body, format="json")
        assert _code(response) == (404, "not_found")
        assert "running" not in response.content.decode()
    body = {"run_id": foreign.run_id, "runner_id": foreign.runner_id, "error": "x"}
    assert _code(coordinator.api.post("/api/v1/runner-groups/dispatch-failed", body, format="json")) == (
        404,
        "not_found",
    )
    assert _run(foreign).status == "running"
    assert _run(mine).status == "assigned"


# ---------------------------------------------------------------- the run binding


def test_it_binds_a_runner_token_to_its_run_and_runner(
    coordinator: Coordinator, stack: Stack, globex_stack: Stack, globex: Organization
) -> None:
    mine = _claimed(coordinator, stack)
    other_stack = services.stack_create(org=stack.organization, name="other", labels={}, spec=SPEC)
    theirs = _claimed(coordinator, other_stack)
    foreign_group, _ = services.runner_group_create(org=globex, name="g")
    foreign = _claimed(Coordinator(foreign_group), globex_stack)
    before = sorted(Run.objects.values_list("id", "status", "assigned_runner_id"))
    for intruder in (mine, foreign):
        for call in (
            lambda r: r.api.post(f"/api/v1/runs/{theirs.run_id}/accept"),
            lambda r: r.api.get(f"/api/v1/runs/{theirs.run_id}/status"),
            lambda r: r.api.post(f"/api/v1/runs/{theirs.run_id}/acknowledging-cancel"),
            lambda r: r.api.post(f"/api/v1/runs/{theirs.run_id}/done", {"outcome": "succeeded"}, format="json"),
            lambda r: r.api.post(f"/api/v1/runners/{theirs.runner_id}/ready"),
            lambda r: r.api.delete(f"/api/v1/runners/{theirs.runner_id}/deregister"),
        ):
            assert _code(call(intruder)) == (403, "run_binding")
    assert sorted(Run.objects.values_list("id", "status", "assigned_runner_id")) == before
    assert Runner.objects.get(id=theirs.runner_id).status == "not_ready"


def test_it_refuses_group_and_user_tokens_on_runner_routes(
    coordinator: Coordinator, stack: Stack, owner_api: APIClient
) -> None:
    runner = _claimed(coordinator, stack)
    for client in (coordinator.api, owner_api):
        assert client.post(f"/api/v1/runs/{runner.run_id}/accept").status_code == 403
        assert client.post(f"/api/v1/runners/{runner.runner_id}/ready").status_code == 403
    assert APIClient().post(f"/api/v1/runs/{runner.run_id}/accept").status_code == 401
    assert _run(runner).status == "assigned"
