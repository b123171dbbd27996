"""run_assign and run_accept, and every refusal of accept (docs/design.md, "When the accept response never
arrives", "When the run is already terminal at accept")."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import connection

from gantry import conf
from gantry.core import services, tokens
from gantry.core.errors import Conflict, GantryError
from gantry.core.models import DeploymentStatus, Run, Runner, RunnerGroup, RunnerStatus, RunStatus, RunToken, Stack
from tests.core.drive import (
    advance,
    at,
    deploy,
    deployment_status,
    drive,
    event_count,
    event_kinds,
    lease,
    new_runner,
    reload,
    row,
    token_row,
)


def test_it_assigns_a_pending_run_with_a_lease_of_the_configured_ttl(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=at(0))
    runner = new_runner(group)

    services.run_assign(run_id=run.id, runner=runner, now=at(7))

    run = reload(run)
    assert run.status == RunStatus.ASSIGNED
    assert run.assigned_runner_id == runner.id
    assert run.assigned_at == at(7)
    assert run.assigned_expires_at == at(7) + lease()
    assert run.first_pending_at == at(0)
    assert run.started_at is None
    # Assigned is still "queued" from the user's point of view.
    assert deployment_status(run) == DeploymentStatus.QUEUED
    assert event_kinds(run) == ["created", "assigned"]


def test_it_refuses_to_reassign_a_run_whose_lapsed_lease_still_names_a_live_runner(
    stack: Stack, group: RunnerGroup
) -> None:
    """The claim's guard: One Runner Per Run holds on this edge too."""
    run = deploy(stack, now=at(0))
    first = new_runner(group)
    services.run_assign(run_id=run.id, runner=first, now=at(1))
    lapsed = at(1) + lease() + timedelta(seconds=1)
    services.run_reset_lease(run_id=run.id, now=lapsed)
    before, events = row(run), event_count()

    with pytest.raises(Conflict) as exc:
        services.run_assign(run_id=run.id, runner=new_runner(group), now=lapsed)

    assert exc.value.code == "invalid_transition"
    assert "no live runner" in exc.value.detail
    assert row(run) == before
    assert event_count() == events


def test_it_takes_the_lease_length_from_gantry_assignment_ttl(
    stack: Stack, group: RunnerGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANTRY_ASSIGNMENT_TTL", "42")
    conf.get.cache_clear()
    try:
        run = deploy(stack, now=at(0))
        services.run_assign(run_id=run.id, runner=new_runner(group), now=at(1))
    finally:
        monkeypatch.undo()
        conf.get.cache_clear()

    assert reload(run).assigned_expires_at == at(1) + timedelta(seconds=42)


def test_it_accepts_an_assigned_run_and_stores_only_the_token_hash(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned", now=at(0))
    assert d.runner is not None

    run, api_token = services.run_accept(run_id=d.run.id, runner_id=d.runner.id, now=at(30))

    assert run.status == RunStatus.RUNNING
    assert run.started_at == at(30)
    assert reload(run).status == RunStatus.RUNNING
    assert deployment_status(run) == DeploymentStatus.RUNNING
    runner = Runner.objects.get(id=d.runner.id)
    assert runner.status == RunnerStatus.BUSY
    assert runner.accepted_at == at(30)
    assert runner.last_seen_at == at(30)
    token = RunToken.objects.get(run_id=run.id)
    assert token.token_sha256 == tokens.sha256_hex(api_token)
    assert token.token_sha256 != api_token
    assert token.revoked_at is None
    assert event_kinds(run) == ["created", "assigned", "accepted"]
    # The clear token is nowhere in the database: not in the token row, the run, or its events.
    with connection.cursor() as cur:
        for table in ("run_token", "run", "run_event", "runner", "deployment"):
            cur.execute(f"SELECT count(*) FROM {table} t WHERE row_to_json(t)::text LIKE %s", [f"%{api_token}%"])
            assert cur.fetchone()[0] == 0, table


def test_it_accepts_up_to_the_last_instant_before_expiry(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned", now=at(0))
    assert d.runner is not None
    expires = d.run.assigned_expires_at
    assert expires is not None

    run, _ = services.run_accept(run_id=d.run.id, runner_id=d.runner.id, now=expires - timedelta(microseconds=1))

    assert run.status == RunStatus.RUNNING


# --------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------


def _refused(run: Run, runner_id: object, now: object) -> GantryError:
    with pytest.raises(Conflict) as exc:
        services.run_accept(run_id=run.id, runner_id=runner_id, now=now)  # type: ignore[arg-type]
    assert exc.value.http_status == 409
    return exc.value


@pytest.mark.parametrize("how", ["skip", "request_cancel"])
def test_it_answers_run_already_terminal_at_info_for_a_discarded_or_cancelled_run(
    stack: Stack, group: RunnerGroup, how: str
) -> None:
    d = advance(drive(stack, group, "assigned", now=at(0)), group, [how])
    assert d.runner is not None
    before, events = row(d.run), event_count()

    err = _refused(d.run, d.runner.id, at(30))

    assert err.code == "run_already_terminal"
    assert err.log_level == logging.INFO
    assert err.extra["status"] == ("discarded" if how == "skip" else "cancelled")
    assert row(d.run) == before
    assert event_count() == events
    assert token_row(d.run) is None
    assert Runner.objects.get(id=d.runner.id).status == RunnerStatus.NOT_READY


def test_it_fails_the_run_when_the_same_runner_accepts_twice(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))
    assert d.runner is not None
    nxt = deploy(stack, now=at(10))
    assert nxt.status == RunStatus.QUEUED

    err = _refused(d.run, d.runner.id, at(20))

    assert err.code == "accept_response_undeliverable"
    assert err.log_level == logging.WARNING
    assert err.extra["status"] == RunStatus.FAILURE
    run = reload(d.run)
    assert run.status == RunStatus.FAILURE
    assert run.finished_at == at(20)
    assert "undeliverable" in run.failure_reason
    assert deployment_status(run) == DeploymentStatus.FAILED
    assert event_kinds(run) == ["created", "assigned", "accepted", "accept_response_undeliverable"]
    # The one token minted by the first accept is revoked; no second one exists.
    assert RunToken.objects.filter(run_id=run.id).count() == 1
    assert RunToken.objects.get(run_id=run.id).revoked_at == at(20)
    # The lane is released and the next queued run promoted.
    nxt = reload(nxt)
    assert nxt.status == RunStatus.PENDING
    assert nxt.first_pending_at == at(20)
    # ... and the deployment may be retried.
    services.deployment_retry(deployment_id=run.deployment_id, now=at(30))


def test_it_fails_a_run_under_cancellation_when_its_runner_accepts_again(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "requested_cancellation", now=at(0))
    assert d.runner is not None

    err = _refused(d.run, d.runner.id, at(20))

    assert err.code == "accept_response_undeliverable"
    assert reload(d.run).status == RunStatus.FAILURE


def test_it_names_a_lease_that_was_reset_to_pending(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned", now=at(0))
    assert d.runner is not None
    later = at(1) + lease() + timedelta(seconds=1)
    services.run_reset_lease(run_id=d.run.id, now=later)
    before, events = row(d.run), event_count()

    err = _refused(d.run, d.runner.id, later)

    assert err.code == "conflict"
    assert err.log_level == logging.WARNING
    assert "pending" in err.detail
    assert "lease" in err.detail
    assert row(d.run) == before
    assert event_count() == events


def test_it_names_a_run_reassigned_to_another_runner(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned", now=at(0))
    assert d.runner is not None
    later = at(1) + lease() + timedelta(seconds=1)
    services.run_reset_lease(run_id=d.run.id, now=later)
    # The run stays bound to its first runner until that one's row is gone
    # (One Runner Per Run); a reaper deleted it, say, but the process is still
    # booting towards /accept with its token.
    first_runner = d.runner.id
    services.runner_deregister(runner_id=first_runner, now=later)
    other = new_runner(group)
    services.run_assign(run_id=d.run.id, runner=other, now=later)
    before, events = row(d.run), event_count()

    err = _refused(d.run, first_runner, later)

    assert err.code == "conflict"
    assert "reassigned" in err.detail
    assert row(d.run) == before
    assert event_count() == events
    # The runner it belongs to now can still accept.
    run, _ = services.run_accept(run_id=d.run.id, runner_id=other.id, now=later)
    assert run.status == RunStatus.RUNNING


def test_it_refuses_another_runner_for_a_running_run_without_failing_it(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))
    stranger = new_runner(group)
    before = row(d.run)

    err = _refused(d.run, stranger.id, at(10))

    assert err.code == "conflict"
    assert "reassigned" in err.detail
    assert row(d.run) == before


def test_it_names_a_lease_past_expiry_that_the_reaper_has_not_reset_yet(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned", now=at(0))
    assert d.runner is not None
    expires = d.run.assigned_expires_at
    assert expires is not None
    before, events = row(d.run), event_count()

    for now in (expires, expires + timedelta(seconds=1)):
        err = _refused(d.run, d.runner.id, now)
        assert err.code == "conflict"
        assert "expiry" in err.detail

    assert row(d.run) == before
    assert event_count() == events
    assert token_row(d.run) is None


@pytest.mark.parametrize(
    ("steps", "status"),
    [
        (["fail"], RunStatus.FAILURE),
        (["startup_timeout"], RunStatus.STARTUP_TIMEOUT),
    ],
)
def test_it_names_a_faulty_terminal_status_without_a_code(
    stack: Stack, group: RunnerGroup, steps: list[str], status: str
) -> None:
    d = advance(drive(stack, group, "assigned", now=at(0)), group, steps)
    assert d.runner is not None
    before, events = row(d.run), event_count()

    err = _refused(d.run, d.runner.id, at(30))

    assert err.code == "conflict"
    assert err.log_level == logging.WARNING
    assert status in err.detail
    assert err.extra["status"] == status
    assert row(d.run) == before
    assert event_count() == events
    assert token_row(d.run) is None
