"""Invariants the database enforces (docs/design.md §2), exercised under real concurrency.

Each racing thread uses its own connection (Django connections are per thread) and
closes it when done. The threads meet at a ``threading.Barrier`` so their
transactions overlap; no test sleeps.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from gantry.core import services
from gantry.core.models import (
    LANE_HOLDERS,
    Deployment,
    Organization,
    Run,
    Runner,
    RunnerGroup,
    RunStatus,
    RunToken,
    Stack,
)
from tests.conftest import SPEC
from tests.core.drive import at, deploy, drive, lease, new_runner, reload

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None


def race(*bodies: Callable[[threading.Barrier], Any]) -> list[Outcome]:
    """Run each body in its own thread and connection; they all wait on one barrier before the contested step."""
    barrier = threading.Barrier(len(bodies), timeout=30)
    outcomes = [Outcome() for _ in bodies]

    def work(i: int, body: Callable[[threading.Barrier], Any]) -> None:
        try:
            outcomes[i].value = body(barrier)
        except BaseException as exc:  # recorded for the test to judge
            outcomes[i].error = exc
            barrier.abort()  # never leave the other thread waiting
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return outcomes


def _split(outcomes: list[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    ok = [o for o in outcomes if o.error is None]
    failed = [o for o in outcomes if o.error is not None]
    return ok, failed


def _one_won_one_hit(outcomes: list[Outcome], index: str) -> None:
    ok, failed = _split(outcomes)
    assert len(ok) == 1, [o.error for o in outcomes]
    assert len(failed) == 1
    assert isinstance(failed[0].error, IntegrityError), repr(failed[0].error)
    assert index in str(failed[0].error)


def _lane_holders(stack: Stack) -> list[Run]:
    return list(Run.objects.filter(stack=stack, status__in=sorted(LANE_HOLDERS)))


def _new_stack(org: Organization, name: str) -> Stack:
    return services.stack_create(org=org, name=name, labels={"gantry:runner-group:os": "linux"}, spec=SPEC)


# --------------------------------------------------------------------------
# (a) one lane holder per stack, raw writes that bypass the services
# --------------------------------------------------------------------------


def _free_lane_with_two_queued(stack: Stack, group: RunnerGroup) -> tuple[Run, Run]:
    """Two queued runs and no holder: the state no service leaves behind, made by hand."""
    holder = drive(stack, group, "running", now=at(0))
    q1, q2 = deploy(stack, now=at(10)), deploy(stack, now=at(11))
    with connection.cursor() as cur:
        cur.execute("UPDATE run SET status = 'succeeded' WHERE id = %s", [holder.run.id])
    assert _lane_holders(stack) == []
    return q1, q2


def _take_lane_by_update(run: Run) -> Callable[[threading.Barrier], None]:
    def body(barrier: threading.Barrier) -> None:
        with transaction.atomic(), connection.cursor() as cur:
            # Both transactions see a free lane before either writes: the check the code would do passes twice.
            cur.execute(
                "SELECT count(*) FROM run WHERE stack_id = %s AND status = ANY(%s)",
                [run.stack_id, sorted(LANE_HOLDERS)],
            )
            assert cur.fetchone()[0] == 0
            barrier.wait()
            cur.execute("UPDATE run SET status = 'pending', first_pending_at = now() WHERE id = %s", [run.id])

    return body


def _take_lane_by_insert(template: Run) -> Callable[[threading.Barrier], uuid.UUID]:
    deployment = Deployment.objects.create(stack_id=template.stack_id, spec=SPEC)
    run_id = uuid.uuid4()

    def body(barrier: threading.Barrier) -> uuid.UUID:
        with transaction.atomic(), connection.cursor() as cur:
            barrier.wait()
            cur.execute(
                "INSERT INTO run (id, organization_id, stack_id, deployment_id, attempt, status, runner_selector,"
                " selector_id, failure_reason, sealed_chunks, first_pending_at)"
                " VALUES (%s, %s, %s, %s, 1, 'pending', '{}'::jsonb, %s, '', 0, now())",
                [run_id, template.organization_id, template.stack_id, deployment.id, template.selector_id],
            )
        return run_id

    return body


@pytest.mark.parametrize("mode", ["update+update", "insert+insert", "update+insert"])
def test_it_lets_only_one_of_two_racing_writers_take_a_lane(stack: Stack, group: RunnerGroup, mode: str) -> None:
    q1, q2 = _free_lane_with_two_queued(stack, group)
    first, second = mode.split("+")
    bodies = [
        _take_lane_by_update(q1) if first == "update" else _take_lane_by_insert(q1),
        _take_lane_by_update(q2) if second == "update" else _take_lane_by_insert(q2),
    ]

    outcomes = race(*bodies)

    _one_won_one_hit(outcomes, "run_one_lane_holder_per_stack")
    holders = _lane_holders(stack)
    assert len(holders) == 1
    assert holders[0].status == RunStatus.PENDING


def test_it_refuses_a_second_lane_holder_outright(stack: Stack, group: RunnerGroup) -> None:
    holder = drive(stack, group, "running", now=at(0))
    queued = deploy(stack, now=at(1))

    with pytest.raises(IntegrityError, match="run_one_lane_holder_per_stack"), transaction.atomic():
        Run.objects.filter(id=queued.id).update(status=RunStatus.PENDING)

    assert reload(queued).status == RunStatus.QUEUED
    assert _lane_holders(stack) == [reload(holder.run)]


# --------------------------------------------------------------------------
# (b) two concurrent deployment_create calls on one free stack
# --------------------------------------------------------------------------


def test_it_makes_exactly_one_of_two_concurrent_deployments_pending(acme: Organization) -> None:
    for round_ in range(5):
        stack = _new_stack(acme, f"race-{round_}")

        def create(barrier: threading.Barrier, seconds: int, stack: Stack = stack) -> Deployment:
            fresh = Stack.objects.get(id=stack.id)
            barrier.wait()
            return services.deployment_create(stack=fresh, now=at(seconds))

        outcomes = race(lambda b: create(b, 0), lambda b: create(b, 1))

        assert [o.error for o in outcomes] == [None, None]
        statuses = sorted(Run.objects.filter(stack=stack).values_list("status", flat=True))
        assert statuses == ["pending", "queued"], f"round {round_}"
        pending = Run.objects.get(stack=stack, status=RunStatus.PENDING)
        assert pending.first_pending_at is not None
        assert Run.objects.get(stack=stack, status=RunStatus.QUEUED).first_pending_at is None


# --------------------------------------------------------------------------
# (c) finishing the holder while a deployment is created never strands a queued run
# --------------------------------------------------------------------------


@pytest.mark.parametrize("already_queued", [0, 1])
def test_it_never_strands_a_queued_run_when_the_holder_ends_during_a_create(
    acme: Organization, group: RunnerGroup, already_queued: int
) -> None:
    for round_ in range(6):
        stack = _new_stack(acme, f"lane-{round_}")
        holder = drive(stack, group, "running", now=at(0))
        earlier = [deploy(stack, now=at(10 + i)) for i in range(already_queued)]

        def finish(barrier: threading.Barrier, run_id: uuid.UUID = holder.run.id) -> None:
            barrier.wait()
            services.run_finish(run_id=run_id, outcome="succeeded", exit_code=0, now=at(100))

        def create(barrier: threading.Barrier, stack: Stack = stack) -> Deployment:
            fresh = Stack.objects.get(id=stack.id)
            barrier.wait()
            return services.deployment_create(stack=fresh, now=at(100))

        # Alternate which thread starts first, so both orders get their chance.
        bodies = [finish, create] if round_ % 2 == 0 else [create, finish]
        outcomes = race(*bodies)

        assert [o.error for o in outcomes] == [None, None]
        assert reload(holder.run).status == RunStatus.SUCCEEDED
        holders = _lane_holders(stack)
        queued = list(Run.objects.filter(stack=stack, status=RunStatus.QUEUED))
        assert len(holders) == 1, f"round {round_}: a queued run is stranded behind no holder"
        assert holders[0].status == RunStatus.PENDING
        assert len(queued) == already_queued
        if earlier:
            # The run that was already waiting goes first; the new one queues behind it.
            assert holders[0].id == earlier[0].id


# --------------------------------------------------------------------------
# (d) one non-terminal run per runner
# --------------------------------------------------------------------------


def test_it_binds_a_runner_to_one_run_only_under_a_race(acme: Organization, group: RunnerGroup) -> None:
    runs = [deploy(_new_stack(acme, f"bound-{i}"), now=at(i)) for i in range(2)]
    runner = new_runner(group)

    def assign(barrier: threading.Barrier, run: Run) -> None:
        with transaction.atomic():
            barrier.wait()
            services.run_assign(run_id=run.id, runner=runner, now=at(10))

    outcomes = race(lambda b: assign(b, runs[0]), lambda b: assign(b, runs[1]))

    _one_won_one_hit(outcomes, "run_one_per_runner")
    statuses = sorted(reload(r).status for r in runs)
    assert statuses == ["assigned", "pending"]
    # The loser's run is untouched: no runner pointer, no event.
    loser = next(reload(r) for r in runs if reload(r).status == RunStatus.PENDING)
    assert loser.assigned_runner_id is None
    assert loser.events.count() == 1


def test_it_lets_a_runner_take_another_run_once_its_run_is_unbound(acme: Organization, group: RunnerGroup) -> None:
    a = deploy(_new_stack(acme, "a"), now=at(0))
    b = deploy(_new_stack(acme, "b"), now=at(0))
    runner = new_runner(group)
    services.run_assign(run_id=a.id, runner=runner, now=at(1))

    with pytest.raises(IntegrityError, match="run_one_per_runner"), transaction.atomic():
        services.run_assign(run_id=b.id, runner=runner, now=at(2))

    # A lapsed lease leaves a pending run that still names the runner but no longer binds it.
    later = at(1) + lease() + lease()
    services.run_reset_lease(run_id=a.id, now=later)
    services.run_assign(run_id=b.id, runner=runner, now=later)
    assert reload(a).assigned_runner_id == runner.id
    assert reload(b).assigned_runner_id == runner.id
    assert reload(b).status == RunStatus.ASSIGNED


# --------------------------------------------------------------------------
# (e) deleting a runner releases its run (ON DELETE SET NULL)
# --------------------------------------------------------------------------


def test_it_nulls_the_run_pointer_when_a_runner_row_is_deleted_by_raw_sql(
    acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    running = drive(stack, group, "running", now=at(0))
    other = _new_stack(acme, "other")
    lapsed = deploy(other, now=at(0))
    stub = new_runner(group)
    services.run_assign(run_id=lapsed.id, runner=stub, now=at(1))
    services.run_reset_lease(run_id=lapsed.id, now=at(1) + lease() + lease())
    assert running.runner is not None

    with connection.cursor() as cur:
        cur.execute("DELETE FROM runner WHERE id = ANY(%s)", [[running.runner.id, stub.id]])
        assert cur.rowcount == 2

    assert not Runner.objects.filter(id__in=[running.runner.id, stub.id]).exists()
    r1, r2 = reload(running.run), reload(lapsed)
    assert r1.assigned_runner_id is None
    assert r2.assigned_runner_id is None
    # Only the pointer goes: the runs' states are the reapers' business.
    assert r1.status == RunStatus.RUNNING
    assert r2.status == RunStatus.PENDING


# --------------------------------------------------------------------------
# (f) one token per run
# --------------------------------------------------------------------------


def test_it_keeps_one_token_per_run(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "running", now=at(0))

    with pytest.raises(IntegrityError), transaction.atomic():
        RunToken.objects.create(run_id=d.run.id, token_sha256="0" * 64)

    assert RunToken.objects.filter(run_id=d.run.id).count() == 1


def test_it_keeps_one_token_per_run_under_a_race(stack: Stack) -> None:
    run = deploy(stack, now=at(0))

    def insert(barrier: threading.Barrier, digest: str) -> None:
        with transaction.atomic():
            barrier.wait()
            RunToken.objects.create(run_id=run.id, token_sha256=digest)

    outcomes = race(lambda b: insert(b, "a" * 64), lambda b: insert(b, "b" * 64))

    _one_won_one_hit(outcomes, "run_token_run_id_key")
    assert RunToken.objects.filter(run_id=run.id).count() == 1


# --------------------------------------------------------------------------
# Transitions racing each other through the services
# --------------------------------------------------------------------------


def test_it_settles_a_cancellation_racing_an_accept_one_way_or_the_other(
    acme: Organization, group: RunnerGroup
) -> None:
    for round_ in range(6):
        d = drive(_new_stack(acme, f"cancel-{round_}"), group, "assigned", now=at(0))
        assert d.runner is not None

        def accept(barrier: threading.Barrier, run_id: uuid.UUID = d.run.id, runner_id: uuid.UUID = d.runner.id) -> str:
            barrier.wait()
            run, _ = services.run_accept(run_id=run_id, runner_id=runner_id, now=at(10))
            return run.status

        def cancel(barrier: threading.Barrier, run_id: uuid.UUID = d.run.id) -> str:
            barrier.wait()
            return services.run_request_cancellation(run_id=run_id, now=at(10)).status

        bodies = [accept, cancel] if round_ % 2 == 0 else [cancel, accept]
        outcomes = race(*bodies)
        by_name = dict(zip([b.__name__ for b in bodies], outcomes, strict=True))
        run = reload(d.run)

        assert by_name["cancel"].error is None, repr(by_name["cancel"].error)
        if by_name["accept"].error is None:
            # Accepted first: the cancellation becomes a request the runner will see.
            assert run.status == RunStatus.REQUESTED_CANCELLATION
            assert by_name["cancel"].value == RunStatus.REQUESTED_CANCELLATION
            assert RunToken.objects.filter(run_id=run.id).exists()
        else:
            # Cancelled first: the late runner is told benignly, and no credentials were minted.
            err = by_name["accept"].error
            assert getattr(err, "code", None) == "run_already_terminal", repr(err)
            assert run.status == RunStatus.CANCELLED
            assert not RunToken.objects.filter(run_id=run.id).exists()
