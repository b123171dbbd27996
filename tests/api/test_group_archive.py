"""DELETE /api/v1/runner-groups/{id}: archive a group (issue 24, deliverable 6).

Real PostgreSQL and Redis; the coordinator's calls go over HTTP with the
group's own token, as runners/coordinator.py sends them.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.errors import GroupBusy
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch import queue
from gantry.dispatch.claim import claim
from tests.dispatch.helpers import deploy, make_stack, runner_count

POLL = "/api/v1/runner-groups/poll"


def _coordinator(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.mark.django_db
class TestArchive:
    def test_it_archives_and_the_token_stops_at_once(self, acme: Organization, owner_api: APIClient) -> None:
        group, token = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
        coordinator = _coordinator(token)
        assert coordinator.get(POLL).status_code == 204

        assert owner_api.delete(f"/api/v1/runner-groups/{group.id}").status_code == 204

        answer = coordinator.get(POLL)
        assert answer.status_code == 401
        assert answer.json()["code"] == "authentication_failed"
        refused = coordinator.post(
            "/api/v1/runner-groups/reconcile", {"workers": []}, format="json"
        )  # every group-token route
        assert refused.status_code == 401
        assert _coordinator(token).get("/api/v1/runner-groups/demand").status_code == 401

    def test_it_leaves_lists_and_the_queue_but_stays_readable(
        self, acme: Organization, owner_api: APIClient, teammate_api: APIClient
    ) -> None:
        kept, _ = services.runner_group_create(org=acme, name="kept", labels={"os": "linux"})
        gone, _ = services.runner_group_create(org=acme, name="gone", labels={"os": "linux"})

        assert owner_api.delete(f"/api/v1/runner-groups/{gone.id}").status_code == 204

        listed = teammate_api.get("/api/v1/orgs/acme/runner-groups").json()
        assert [g["name"] for g in listed] == ["kept"]
        assert [g.name for g in queue.group_facts(organization_id=acme.id)] == ["kept"]
        read = teammate_api.get(f"/api/v1/runner-groups/{gone.id}")
        assert read.status_code == 200
        assert read.json()["archived_at"] is not None
        # Gone for everything else: a second archive, a rotation, a drain.
        assert owner_api.delete(f"/api/v1/runner-groups/{gone.id}").status_code == 404
        assert owner_api.post(f"/api/v1/runner-groups/{gone.id}/rotate-token").status_code == 404
        assert owner_api.post(f"/api/v1/runner-groups/{gone.id}/drain").status_code == 404
        assert kept.id in [g["id"] for g in listed]

    def test_its_name_may_be_taken_again_by_a_new_group(self, acme: Organization, owner_api: APIClient) -> None:
        old, _ = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
        other, _ = services.runner_group_create(org=acme, name="arm", labels={"os": "linux"})
        assert owner_api.delete(f"/api/v1/runner-groups/{old.id}").status_code == 204

        made = owner_api.post("/api/v1/orgs/acme/runner-groups", {"name": "LINUX"}, format="json")
        assert made.status_code == 201, made.content
        assert made.json()["id"] != old.id
        assert sorted(g["name"] for g in owner_api.get("/api/v1/orgs/acme/runner-groups").json()) == ["LINUX", "arm"]
        assert owner_api.get(f"/api/v1/runner-groups/{old.id}").json()["name"] == "linux"  # history stays
        # Two live groups of one name are still refused, by create and by rename.
        again = owner_api.post("/api/v1/orgs/acme/runner-groups", {"name": "linux"}, format="json")
        assert (again.status_code, again.json()["code"]) == (409, "name_taken")
        renamed = owner_api.patch(f"/api/v1/runner-groups/{other.id}", {"name": "Linux"}, format="json")
        assert (renamed.status_code, renamed.json()["code"]) == (409, "name_taken")

    def test_the_claim_never_hands_an_archived_group_a_run(self, acme: Organization) -> None:
        group, _ = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
        services.runner_group_archive(group=group)
        run = deploy(make_stack(acme, "app", {"os": "linux"}))

        assert claim(group=group) is None

        assert Run.objects.get(id=run.id).status == RunStatus.PENDING

    def test_it_refuses_a_group_holding_a_run_and_changes_nothing(
        self, acme: Organization, owner_api: APIClient
    ) -> None:
        group, token = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
        run = deploy(make_stack(acme, "app", {"os": "linux"}))
        won = claim(group=group)
        assert won is not None
        assert won.run_id == run.id

        answer = owner_api.delete(f"/api/v1/runner-groups/{group.id}")

        assert answer.status_code == 409
        assert answer.json()["code"] == "group_busy"
        assert answer.json()["run_id"] == str(run.id)
        group.refresh_from_db()
        assert group.archived_at is None
        assert Runner.objects.filter(runner_group=group).count() == 1
        assert _coordinator(token).get(POLL).status_code == 204  # the token still works

    def test_it_removes_idle_runners_and_clears_the_org_default(self, acme: Organization) -> None:
        group, _ = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
        services.org_update(org=acme, default_runner_group_id=group.id)
        Runner.objects.create(runner_group=group)  # a slot held by a runner bound to no run

        services.runner_group_archive(group=group)

        assert runner_count(group) == 0
        acme.refresh_from_db()
        assert acme.default_runner_group_id is None

    def test_a_member_is_refused_and_another_org_sees_nothing(
        self, acme: Organization, teammate_api: APIClient, outsider_api: APIClient
    ) -> None:
        group, _ = services.runner_group_create(org=acme, name="linux", labels={})

        assert teammate_api.delete(f"/api/v1/runner-groups/{group.id}").status_code == 403
        assert outsider_api.delete(f"/api/v1/runner-groups/{group.id}").status_code == 404
        group.refresh_from_db()
        assert group.archived_at is None


# ---------------------------------------------------------------- against a concurrent claim


def _blocked_on_a_lock(timeout: float = 10.0) -> None:
    """Wait until some session of this database waits on a row lock (the other thread got there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cur.fetchone()[0]:
                return
        time.sleep(0.02)
    raise AssertionError("the other thread never waited on the group's lock")


def _in_thread(body: object) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def work() -> None:
        try:
            out["value"] = body()  # type: ignore[operator]
        except BaseException as exc:  # judged by the test
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    return thread, out


@pytest.mark.django_db(transaction=True)
def test_a_claim_in_flight_wins_and_the_archive_is_refused(acme: Organization) -> None:
    group, _ = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
    run = deploy(make_stack(acme, "app", {"os": "linux"}))
    claimed = threading.Event()
    release = threading.Event()

    def claim_and_hold() -> object:
        with transaction.atomic():  # the claim's row lock is held until this commits
            won = claim(group=group)
            claimed.set()
            release.wait(30)
        return won

    claimer, claim_out = _in_thread(claim_and_hold)
    assert claimed.wait(30)
    archiver, archive_out = _in_thread(lambda: services.runner_group_archive(group=group))
    _blocked_on_a_lock()
    release.set()
    claimer.join(30)
    archiver.join(30)

    assert "error" not in claim_out, claim_out
    assert getattr(claim_out["value"], "run_id", None) == run.id
    assert isinstance(archive_out.get("error"), GroupBusy), archive_out
    assert RunnerGroup.objects.get(id=group.id).archived_at is None


@pytest.mark.django_db(transaction=True)
def test_an_archive_in_flight_wins_and_the_claim_takes_nothing(acme: Organization) -> None:
    group, _ = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
    run = deploy(make_stack(acme, "app", {"os": "linux"}))
    archived = threading.Event()
    release = threading.Event()

    def archive_and_hold() -> object:
        with transaction.atomic():
            services.runner_group_archive(group=group)
            archived.set()
            release.wait(30)
        return True

    archiver, archive_out = _in_thread(archive_and_hold)
    assert archived.wait(30)
    claimer, claim_out = _in_thread(lambda: claim(group=group))
    _blocked_on_a_lock()
    release.set()
    archiver.join(30)
    claimer.join(30)

    assert archive_out == {"value": True}
    assert claim_out == {"value": None}
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING
    assert Runner.objects.filter(runner_group=group).count() == 0
