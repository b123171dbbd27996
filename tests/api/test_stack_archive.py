"""DELETE /api/v1/stacks/{id}: archiving a stack (issue 24, deliverable 6), its refusals, its race with the claim."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.errors import StackBusy
from gantry.core.models import Deployment, Run, RunnerGroup, RunStatus, Stack
from gantry.dispatch.claim import claim
from tests.conftest import SPEC
from tests.dispatch.helpers import deploy
from tests.queue.helpers import poll, queue_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_buckets")]


def archive(client: APIClient, stack: Stack) -> tuple[int, dict]:
    response = client.delete(f"/api/v1/stacks/{stack.id}")
    return response.status_code, (response.json() if response.content else {})


def test_it_archives_a_stack_cancelling_its_waiting_runs_and_keeping_its_history(
    owner_api: APIClient, stack: Stack
) -> None:
    pending = deploy(stack)
    queued = deploy(stack)
    assert (pending.status, queued.status) == (RunStatus.PENDING, RunStatus.QUEUED)

    status, _ = archive(owner_api, stack)

    assert status == 204
    stack.refresh_from_db()
    assert stack.archived_at is not None
    assert set(Run.objects.filter(stack=stack).values_list("status", flat=True)) == {RunStatus.CANCELLED}
    # Through the cancel service: each run has its "cancelled" event, by the admin; the queued one was never promoted.
    for run in (pending, queued):
        kinds = list(Run.objects.get(id=run.id).events.values_list("kind", "detail"))
        assert ("cancelled", {"by": "owner"}) in kinds
        assert "promoted" not in [k for k, _ in kinds]
    assert set(Deployment.objects.filter(stack=stack).values_list("status", flat=True)) == {"cancelled"}
    # It leaves the stacks list and the queue; the stack, its deployments and runs stay readable.
    assert owner_api.get("/api/v1/orgs/acme/stacks").json() == []
    assert queue_of(owner_api)["runs"] == []
    body = owner_api.get(f"/api/v1/stacks/{stack.id}").json()
    assert body["archived_at"] is not None
    assert body["name"] == "web"
    assert len(owner_api.get(f"/api/v1/stacks/{stack.id}/deployments").json()) == 2
    assert owner_api.get(f"/api/v1/runs/{pending.id}").json()["status"] == "cancelled"


def test_an_archived_stack_takes_no_deployment_retry_or_change(owner_api: APIClient, stack: Stack) -> None:
    run = deploy(stack)
    assert archive(owner_api, stack)[0] == 204

    response = owner_api.post(f"/api/v1/stacks/{stack.id}/deployments", {}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "stack_archived"
    response = owner_api.post(f"/api/v1/deployments/{run.deployment_id}/retry")
    assert response.status_code == 409
    assert response.json()["code"] == "stack_archived"
    response = owner_api.patch(f"/api/v1/stacks/{stack.id}", {"name": "renamed"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "stack_archived"
    assert Run.objects.filter(stack=stack).count() == 1
    assert Stack.objects.get(id=stack.id).name == "web"


def test_archiving_twice_changes_nothing(owner_api: APIClient, stack: Stack) -> None:
    assert archive(owner_api, stack)[0] == 204
    first = Stack.objects.get(id=stack.id).archived_at
    assert archive(owner_api, stack)[0] == 204
    assert Stack.objects.get(id=stack.id).archived_at == first


def test_its_name_may_be_taken_again_by_a_new_stack(owner_api: APIClient, stack: Stack) -> None:
    assert archive(owner_api, stack)[0] == 204
    response = owner_api.post("/api/v1/orgs/acme/stacks", {"name": "WEB", "spec": SPEC}, format="json")
    assert response.status_code == 201, response.content
    assert [s["name"] for s in owner_api.get("/api/v1/orgs/acme/stacks").json()] == ["WEB"]
    # Two live stacks of one name are still refused.
    response = owner_api.post("/api/v1/orgs/acme/stacks", {"name": "web"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "name_taken"


def start(claimed: dict) -> None:
    """The runner's first calls over the protocol: ready, accept (the run is running)."""
    runner = APIClient()
    runner.credentials(HTTP_AUTHORIZATION=f"Bearer {claimed['runner_token']}")
    assert runner.post(f"/api/v1/runners/{claimed['runner_id']}/ready", {}, format="json").status_code == 204
    assert runner.post(f"/api/v1/runs/{claimed['run_id']}/accept", {}, format="json").status_code == 200


@pytest.mark.parametrize("started", [False, True], ids=["claimed", "running"])
def test_it_is_refused_while_a_run_is_claimed_or_executing(
    owner_api: APIClient, stack: Stack, group: RunnerGroup, started: bool
) -> None:
    holder = deploy(stack)
    waiting = deploy(stack)
    claimed = poll(group)
    assert claimed is not None
    assert claimed["run_id"] == str(holder.id)
    if started:
        start(claimed)

    status, body = archive(owner_api, stack)

    assert status == 409
    assert body["code"] == "stack_busy"
    assert body["run_id"] == str(holder.id)
    assert body["status"] == ("running" if started else "assigned")
    assert Stack.objects.get(id=stack.id).archived_at is None
    assert Run.objects.get(id=waiting.id).status == RunStatus.QUEUED  # nothing was cancelled
    assert Run.objects.get(id=holder.id).status == (RunStatus.RUNNING if started else RunStatus.ASSIGNED)


def test_a_member_is_refused_and_another_org_sees_nothing(
    teammate_api: APIClient, outsider_api: APIClient, stack: Stack
) -> None:
    run = deploy(stack)
    status, body = archive(teammate_api, stack)
    assert status == 403
    assert body["code"] == "forbidden"
    status, body = archive(outsider_api, stack)
    assert status == 404
    assert Stack.objects.get(id=stack.id).archived_at is None
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING


# ---------------------------------------------------------------- the race with the claim


def _lock_waiters() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_locked_the_run_first_makes_the_archive_busy(stack: Stack, group: RunnerGroup) -> None:
    """The claim holds its run row (its transaction open); the archive waits on that row, then sees it claimed."""
    run = deploy(stack)
    claimed = threading.Event()
    release = threading.Event()
    outcome: dict[str, object] = {}

    def claimer() -> None:
        try:
            with transaction.atomic():
                outcome["claim"] = claim(group=group)
                claimed.set()
                assert release.wait(30)
        finally:
            connection.close()

    def archiver() -> None:
        try:
            services.stack_archive(stack_id=stack.id)
        except StackBusy as exc:
            outcome["archive"] = exc
        finally:
            connection.close()

    a = threading.Thread(target=claimer)
    a.start()
    assert claimed.wait(30)
    b = threading.Thread(target=archiver)
    b.start()
    deadline = time.monotonic() + 10
    while _lock_waiters() == 0:  # the archive is waiting on the claim's lock
        assert time.monotonic() < deadline, "the archive never waited for the claim"
        time.sleep(0.02)
    release.set()
    a.join(30)
    b.join(30)

    assert outcome["claim"] is not None
    assert isinstance(outcome["archive"], StackBusy)
    assert Stack.objects.get(id=stack.id).archived_at is None
    assert Run.objects.get(id=run.id).status == RunStatus.ASSIGNED


@pytest.mark.django_db(transaction=True)
def test_a_claim_after_the_archive_locked_the_runs_finds_nothing(stack: Stack, group: RunnerGroup) -> None:
    """The archive holds the stack's runs (its transaction open); the claim skips them and takes nothing."""
    run = deploy(stack)
    archived = threading.Event()
    release = threading.Event()

    def archiver() -> None:
        try:
            with transaction.atomic():
                services.stack_archive(stack_id=stack.id)
                archived.set()
                assert release.wait(30)
        finally:
            connection.close()

    b = threading.Thread(target=archiver)
    b.start()
    assert archived.wait(30)
    try:
        assert claim(group=group) is None  # SKIP LOCKED: the claim never waits, and never gets the run
    finally:
        release.set()
        b.join(30)
    assert Stack.objects.get(id=stack.id).archived_at is not None
    assert Run.objects.get(id=run.id).status == RunStatus.CANCELLED
    assert claim(group=group) is None  # and after the commit, it is cancelled


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(5))
def test_archive_and_claim_at_once_end_in_one_consistent_state(round_: int, stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack)
    barrier = threading.Barrier(2, timeout=30)
    outcome: dict[str, object] = {}

    def claimer() -> None:
        try:
            barrier.wait()
            outcome["claim"] = claim(group=group)
        finally:
            connection.close()

    def archiver() -> None:
        try:
            barrier.wait()
            services.stack_archive(stack_id=stack.id)
            outcome["archive"] = "archived"
        except StackBusy:
            outcome["archive"] = "busy"
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer), threading.Thread(target=archiver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    status = Run.objects.get(id=run.id).status
    archived_at = Stack.objects.get(id=stack.id).archived_at
    if outcome["claim"] is not None:
        assert (outcome["archive"], status, archived_at) == ("busy", RunStatus.ASSIGNED, None)
    else:
        assert outcome["archive"] == "archived"
        assert status == RunStatus.CANCELLED
        assert archived_at is not None
