"""Members: the one-time set-password link, its re-issue, invitations an existing user accepts, usernames."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from gantry.core.models import Invitation, Membership, Organization, Role

pytestmark = pytest.mark.django_db

MEMBERS = "/api/v1/orgs/acme/members"


def add(client: APIClient, username: str, role: str = "member") -> dict:
    response = client.post(MEMBERS, {"username": username, "role": role}, format="json")
    assert response.status_code in (200, 201, 202), response.content
    return {**response.json(), "http_status": response.status_code}


def set_password_through(link: str, password: str) -> Client:
    """Follow the link as a browser: Django's confirm view, then the form; answers the logged-in client."""
    browser = Client()
    form_page = browser.get(urlsplit(link).path, follow=True)
    assert form_page.status_code == 200
    assert form_page.context["validlink"], "the link should open the form"
    done = browser.post(form_page.redirect_chain[-1][0], {"new_password1": password, "new_password2": password})
    assert done.status_code == 302
    return browser


def test_a_new_user_gets_a_link_that_sets_a_password_once(owner_api: APIClient, acme: Organization) -> None:
    body = add(owner_api, "dana")
    assert body["http_status"] == 201
    assert body["set_password_url"].startswith("http://testserver/set-password/")
    assert body["set_password_expires_at"]
    assert not User.objects.get(username="dana").has_usable_password()

    browser = set_password_through(body["set_password_url"], "a-long-new-password")

    assert User.objects.get(username="dana").check_password("a-long-new-password")
    assert browser.get("/").status_code == 302  # logged in: the root leads to the queue
    assert browser.get("/", follow=True).redirect_chain[-1][0] == "/orgs/acme/queue"
    # Spent: the same link no longer opens the form.
    again = Client().get(urlsplit(body["set_password_url"]).path, follow=True)
    assert again.context["validlink"] is False


def test_an_org_admin_reissues_a_link_and_the_old_one_dies(owner_api: APIClient, acme: Organization) -> None:
    first = add(owner_api, "erin")["set_password_url"]
    response = owner_api.post(f"{MEMBERS}/erin/password-link")
    assert response.status_code == 200
    second = response.json()["set_password_url"]
    assert second != first
    assert Client().get(urlsplit(first).path, follow=True).context["validlink"] is False
    set_password_through(second, "another-long-password")


def test_no_link_for_a_claimed_account(owner_api: APIClient, teammate: User) -> None:
    response = owner_api.post(f"{MEMBERS}/teammate/password-link")
    assert response.status_code == 409
    assert response.json()["code"] == "account_claimed"


def test_no_link_for_someone_who_is_also_in_another_org(
    owner_api: APIClient, acme: Organization, globex: Organization
) -> None:
    user = User.objects.create_user(username="shared")  # no password yet
    Membership.objects.create(user=user, organization=acme, role=Role.MEMBER)
    Membership.objects.create(user=user, organization=globex, role=Role.MEMBER)
    response = owner_api.post(f"{MEMBERS}/shared/password-link")
    assert response.status_code == 403


def test_a_member_cannot_issue_links(teammate_api: APIClient, owner: User) -> None:
    assert teammate_api.post(f"{MEMBERS}/owner/password-link").status_code == 403


def test_an_existing_user_is_invited_and_joins_only_on_accepting(
    owner_api: APIClient, outsider: User, outsider_api: APIClient, acme: Organization
) -> None:
    body = add(owner_api, "outsider", "admin")
    assert body["http_status"] == 202
    assert body["status"] == "invited"
    assert not Membership.objects.filter(user=outsider, organization=acme).exists()
    assert outsider_api.get("/api/v1/orgs/acme").status_code == 404  # not a member yet

    listed = outsider_api.get("/api/v1/invitations").json()
    assert [(i["org"], i["role"], i["invited_by"]) for i in listed] == [("acme", "admin", "owner")]
    accepted = outsider_api.post(f"/api/v1/invitations/{body['invitation_id']}/accept")

    assert accepted.status_code == 200
    assert Membership.objects.get(user=outsider, organization=acme).role == Role.ADMIN
    assert not Invitation.objects.exists()
    assert outsider_api.get("/api/v1/orgs/acme").status_code == 200


def test_a_superuser_is_never_attached_without_consent(owner_api: APIClient, root: User, acme: Organization) -> None:
    assert add(owner_api, "root")["http_status"] == 202
    assert not Membership.objects.filter(user=root).exists()


def test_an_invitation_can_be_declined_and_is_only_its_users(
    owner_api: APIClient, outsider: User, outsider_api: APIClient, teammate_api: APIClient, acme: Organization
) -> None:
    invitation = add(owner_api, "outsider")["invitation_id"]
    assert teammate_api.post(f"/api/v1/invitations/{invitation}/accept").status_code == 404
    assert outsider_api.post(f"/api/v1/invitations/{invitation}/decline").status_code == 204
    assert outsider_api.post(f"/api/v1/invitations/{invitation}/accept").status_code == 404
    assert not Membership.objects.filter(user=outsider, organization=acme).exists()


@pytest.mark.parametrize(
    "username", ["bad\u202ename", "tab\tname", "nul\x00", "new\nline", "sp ace", "bell\x07", "zero\u200bwidth"]
)
def test_usernames_pass_djangos_validator(owner_api: APIClient, acme: Organization, username: str) -> None:
    before = User.objects.count()
    response = owner_api.post(MEMBERS, {"username": username, "role": "member"}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert User.objects.count() == before


def test_a_new_org_admin_can_use_the_scoped_admin(owner_api: APIClient, acme: Organization) -> None:
    link = add(owner_api, "frank", "admin")["set_password_url"]
    browser = set_password_through(link, "frank-long-password")
    assert browser.get("/admin/core/organization/").status_code == 200
