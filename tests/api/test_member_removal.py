"""Removing members (DELETE /orgs/{org}/members/{username}) and the rule that an org keeps an admin (last_admin)."""

from __future__ import annotations

import threading
import time

import pytest
import yaml
from django.contrib.auth.models import User
from django.db import connection, transaction
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.errors import GantryError, LastAdmin
from gantry.core.models import Invitation, Membership, Organization, Role
from gantry.core.services import members as members_service
from tests.api.test_schema import SCHEMA

pytestmark = pytest.mark.django_db

MEMBERS = "/api/v1/orgs/acme/members"


def members(org: Organization) -> dict[str, str]:
    return dict(Membership.objects.filter(organization=org).values_list("user__username", "role"))


def test_it_removes_a_member_and_their_pending_invitation(
    owner_api: APIClient, owner: User, teammate: User, acme: Organization
) -> None:
    Invitation.objects.create(user=teammate, organization=acme, role=Role.ADMIN, invited_by=owner)
    response = owner_api.delete(f"{MEMBERS}/teammate")
    assert response.status_code == 204, response.content
    assert members(acme) == {"owner": "admin"}
    assert not Invitation.objects.filter(user=teammate).exists()
    assert User.objects.filter(username="teammate").exists()  # the account stays; only the membership goes


def test_it_revokes_an_invitation_of_someone_not_yet_a_member(
    owner_api: APIClient, outsider: User, outsider_api: APIClient, acme: Organization
) -> None:
    invited = owner_api.post(MEMBERS, {"username": "outsider", "role": "member"}, format="json")
    assert invited.status_code == 202
    assert owner_api.delete(f"{MEMBERS}/outsider").status_code == 204
    assert not Invitation.objects.exists()
    assert outsider_api.post(f"/api/v1/invitations/{invited.json()['invitation_id']}/accept").status_code == 404


def test_it_answers_404_for_a_username_that_is_neither_member_nor_invited(
    owner_api: APIClient, outsider: User, acme: Organization
) -> None:
    for username in ("nobody", "outsider"):  # unknown; known but of another org
        response = owner_api.delete(f"{MEMBERS}/{username}")
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"


def test_it_refuses_a_member_removing_someone_else_and_changes_nothing(
    teammate_api: APIClient, owner: User, acme: Organization
) -> None:
    other = User.objects.create_user(username="other", password="pw-other")
    Membership.objects.create(user=other, organization=acme, role=Role.MEMBER)
    before = members(acme)
    for username in ("owner", "other"):
        response = teammate_api.delete(f"{MEMBERS}/{username}")
        assert response.status_code == 403
        assert response.json()["code"] == "forbidden"
    assert members(acme) == before


def test_it_hides_the_org_from_a_non_member_and_refuses_no_credentials(
    outsider_api: APIClient, anon: APIClient, teammate: User, acme: Organization
) -> None:
    assert outsider_api.delete(f"{MEMBERS}/teammate").status_code == 404
    assert anon.delete(f"{MEMBERS}/teammate").status_code == 401
    assert "teammate" in members(acme)


def test_it_lets_a_member_leave(teammate_api: APIClient, owner: User, teammate: User, acme: Organization) -> None:
    assert teammate_api.delete(f"{MEMBERS}/teammate").status_code == 204
    assert members(acme) == {"owner": "admin"}
    assert teammate_api.get("/api/v1/orgs/acme").status_code == 404  # no longer a member


def test_it_never_removes_the_last_admin(
    owner_api: APIClient, root_api: APIClient, owner: User, teammate: User, acme: Organization
) -> None:
    for client in (owner_api, root_api):  # the admin leaving, and a super-admin (who is not counted)
        response = client.delete(f"{MEMBERS}/owner")
        assert response.status_code == 409
        assert response.json()["code"] == "last_admin"
    assert members(acme) == {"owner": "admin", "teammate": "member"}


def test_it_never_demotes_the_last_admin_through_the_role_change(
    owner_api: APIClient, owner: User, teammate: User, acme: Organization
) -> None:
    response = owner_api.post(MEMBERS, {"username": "owner", "role": "member"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "last_admin"
    assert members(acme)["owner"] == "admin"


def test_with_a_second_admin_the_first_may_step_down_or_leave(
    owner_api: APIClient, owner: User, teammate: User, acme: Organization
) -> None:
    assert owner_api.post(MEMBERS, {"username": "teammate", "role": "admin"}, format="json").status_code == 200
    assert owner_api.post(MEMBERS, {"username": "owner", "role": "member"}, format="json").status_code == 200
    assert members(acme) == {"owner": "member", "teammate": "admin"}
    # owner is a member now: removing the admin is not theirs to do; leaving is.
    assert owner_api.delete(f"{MEMBERS}/teammate").status_code == 403
    assert owner_api.delete(f"{MEMBERS}/owner").status_code == 204
    assert members(acme) == {"teammate": "admin"}


def test_staff_goes_with_the_last_admin_role(
    owner_api: APIClient, owner: User, teammate: User, outsider: User, acme: Organization, globex: Organization
) -> None:
    """Promotion makes staff (the Django admin); demotion or removal from the last admin role clears it."""
    assert owner_api.post(MEMBERS, {"username": "teammate", "role": "admin"}, format="json").status_code == 200
    teammate.refresh_from_db()
    assert teammate.is_staff
    members_service.grant(org=globex, user=teammate, role=Role.ADMIN)  # an admin of two orgs

    assert owner_api.post(MEMBERS, {"username": "teammate", "role": "member"}, format="json").status_code == 200
    teammate.refresh_from_db()
    assert teammate.is_staff  # still globex's admin

    services.membership_remove(org=globex, username="teammate", by=teammate)  # leaves globex
    teammate.refresh_from_db()
    assert not teammate.is_staff  # an admin nowhere now
    assert members(acme)["teammate"] == "member"

    # The last admin role removed, not demoted: the same.
    assert owner_api.post(MEMBERS, {"username": "teammate", "role": "admin"}, format="json").status_code == 200
    assert owner_api.delete(f"{MEMBERS}/teammate").status_code == 204
    teammate.refresh_from_db()
    assert not teammate.is_staff


def test_a_super_admin_keeps_staff_when_demoted(root: User, owner: User, acme: Organization) -> None:
    members_service.grant(org=acme, user=root, role=Role.ADMIN)
    members_service.grant(org=acme, user=root, role=Role.MEMBER)
    root.refresh_from_db()
    assert root.is_staff


def _wait_for_lock_waiters(count: int, timeout: float = 10.0) -> None:
    """Until ``count`` sessions of this database wait on a row lock (the threads are inside the rule)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] >= count:
                return
            time.sleep(0.05)
    raise AssertionError(f"{count} sessions never waited on the admins' lock")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["remove", "demote"])
def test_two_admins_removing_each_other_at_once_cannot_both_succeed(acme: Organization, how: str) -> None:
    ada = User.objects.create_user(username="ada", password="pw-ada")
    bob = User.objects.create_user(username="bob", password="pw-bob")
    for user in (ada, bob):
        Membership.objects.create(user=user, organization=acme, role=Role.ADMIN)
    outcomes: dict[str, str] = {}

    def act(by: User, target: str) -> None:
        try:
            if how == "remove":
                services.membership_remove(org=acme, username=target, by=by)
            else:
                services.membership_set(org=acme, username=target, role=Role.MEMBER, by=by)
            outcomes[by.username] = "done"
        except GantryError as exc:
            outcomes[by.username] = exc.code
        finally:
            connection.close()  # this thread's own connection

    # Hold the admins' rows, so both threads reach the rule before either can go on: the race, made certain.
    with transaction.atomic():
        list(Membership.objects.select_for_update().filter(organization=acme, role=Role.ADMIN))
        threads = [threading.Thread(target=act, args=(ada, "bob")), threading.Thread(target=act, args=(bob, "ada"))]
        for thread in threads:
            thread.start()
        _wait_for_lock_waiters(2)
    for thread in threads:
        thread.join(timeout=20)
        assert not thread.is_alive()

    assert sorted(outcomes.values()) == ["done", LastAdmin.code]
    assert list(Membership.objects.filter(organization=acme, role=Role.ADMIN)) != []


def test_the_schema_lists_the_delete_with_its_refusals() -> None:
    op = yaml.safe_load(SCHEMA.read_text())["paths"]["/api/v1/orgs/{org}/members/{username}"]["delete"]
    assert set(op["responses"]) == {"204", "401", "403", "404", "409"}
