"""The members and account pages over HTTP (Django's test client): scoping, refusals, what each one shows.

The browser tests (tests/browser/test_members.py) press the buttons; these check
what a crafted request gets, and that every refusal changes nothing.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from gantry.core.models import Invitation, Membership, Organization, Role

pytestmark = pytest.mark.django_db

PAGE = "/orgs/acme/members"


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def roles(org: Organization) -> dict[str, str]:
    return dict(Membership.objects.filter(organization=org).values_list("user__username", "role"))


def shown(response: object) -> str:
    return " ".join(str(m) for m in response.context["messages"])  # type: ignore[attr-defined]


def test_it_lists_members_and_invitations_with_admin_buttons_for_admins_only(
    owner: User, teammate: User, outsider: User, acme: Organization
) -> None:
    Invitation.objects.create(user=outsider, organization=acme, role=Role.MEMBER, invited_by=owner)
    admin_page = browser(owner).get(PAGE).content.decode()
    assert 'data-member="owner"' in admin_page
    assert 'data-member="teammate"' in admin_page
    assert 'data-invitation="outsider"' in admin_page
    assert "2 members, 1 pending invitation" in admin_page
    for action in ("invite", "role", "remove", "revoke"):
        assert f'data-action="{action}"' in admin_page
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT[^"]+">\d{4}-\d\d-\d\d \d\d:\d\d UTC</time>', admin_page)

    member_page = browser(teammate).get(PAGE).content.decode()
    assert 'data-member="owner"' in member_page
    assert 'data-invitation="outsider"' in member_page
    for action in ("invite", "role", "remove", "revoke"):
        assert f'data-action="{action}"' not in member_page
    assert 'data-action="leave"' in member_page  # one's own row only


def test_another_orgs_members_page_and_buttons_are_404(outsider: User, teammate: User, acme: Organization) -> None:
    client = browser(outsider)
    assert client.get(PAGE).status_code == 404
    assert client.post(f"{PAGE}/invite", {"who": "x", "role": "member"}).status_code == 404
    assert client.post(f"{PAGE}/teammate/remove").status_code == 404
    assert "teammate" in roles(acme)


def test_a_member_pressing_an_admins_button_gets_403_and_nothing_changes(
    owner: User, teammate: User, acme: Organization
) -> None:
    client = browser(teammate)
    before = (roles(acme), User.objects.count(), Invitation.objects.count())
    assert client.post(f"{PAGE}/invite", {"who": "new@example.com", "role": "admin"}).status_code == 403
    assert client.post(f"{PAGE}/teammate/role", {"role": "admin"}).status_code == 403
    assert client.post(f"{PAGE}/owner/remove").status_code == 403
    assert client.get(PAGE).status_code == 200
    assert (roles(acme), User.objects.count(), Invitation.objects.count()) == before


def test_the_pages_want_a_login_and_a_post(owner: User, acme: Organization) -> None:
    assert Client().get(PAGE)["Location"].startswith("/login")
    assert Client().get("/account")["Location"].startswith("/login")
    assert browser(owner).get(f"{PAGE}/invite").status_code == 405
    assert browser(owner).get("/account/token").status_code == 405
    assert browser(owner).post(f"{PAGE}/owner/promote").status_code == 404


def test_an_admin_invites_an_existing_user_by_email_and_a_new_one_who_gets_a_link(
    owner: User, outsider: User, acme: Organization
) -> None:
    outsider.email = "Out.Sider@example.com"
    outsider.save()
    client = browser(owner)
    response = client.post(f"{PAGE}/invite", {"who": "out.sider@EXAMPLE.com", "role": "admin"}, follow=True)
    assert "Invited outsider as admin" in shown(response)
    assert Invitation.objects.get(user=outsider).role == Role.ADMIN
    assert "outsider" not in roles(acme)  # not without their consent

    response = client.post(f"{PAGE}/invite", {"who": "dana@example.com", "role": "member"}, follow=True)
    link = re.search(r"http://testserver/set-password/\S+", shown(response))
    assert link is not None, shown(response)
    dana = User.objects.get(username="dana@example.com")
    assert dana.email == "dana@example.com"
    assert not dana.has_usable_password()
    assert roles(acme)["dana@example.com"] == "member"
    # The link is the set-password flow's own: it opens the form.
    assert Client().get(urlsplit(link.group(0)).path, follow=True).context["validlink"]
    # Shown once: the next page has no message.
    assert "set-password" not in client.get(PAGE).content.decode()


@pytest.mark.parametrize("who", ["not an email@", "bad name", "x" * 151, ""])
def test_a_bad_invite_is_a_message_and_changes_nothing(owner: User, acme: Organization, who: str) -> None:
    before = (User.objects.count(), Invitation.objects.count())
    response = browser(owner).post(f"{PAGE}/invite", {"who": who, "role": "member"}, follow=True)
    assert response.status_code == 200
    assert [m.level_tag for m in response.context["messages"]] == ["error"]
    assert (User.objects.count(), Invitation.objects.count()) == before


def test_role_changes_and_the_last_admin_refusal_are_messages(owner: User, teammate: User, acme: Organization) -> None:
    client = browser(owner)
    response = client.post(f"{PAGE}/teammate/role", {"role": "owner-of-everything"}, follow=True)
    assert "role must be one of" in shown(response)
    response = client.post(f"{PAGE}/owner/role", {"role": "member"}, follow=True)
    assert "last admin" in shown(response)
    response = client.post(f"{PAGE}/owner/remove", follow=True)
    assert "last admin" in shown(response)
    assert roles(acme) == {"owner": "admin", "teammate": "member"}
    assert client.post(f"{PAGE}/nobody/role", {"role": "admin"}).status_code == 404

    response = client.post(f"{PAGE}/teammate/role", {"role": "admin"}, follow=True)
    assert "teammate is admin now" in shown(response)
    response = client.post(f"{PAGE}/teammate/remove", follow=True)
    assert "teammate was removed" in shown(response)
    assert roles(acme) == {"owner": "admin"}


def test_a_member_leaves_from_the_page(owner: User, teammate: User, acme: Organization) -> None:
    response = browser(teammate).post(f"{PAGE}/teammate/remove", follow=True)
    assert "You left acme" in shown(response)
    assert "teammate" not in roles(acme)


def test_the_account_page_shows_orgs_and_regenerates_the_token_once(
    owner: User, outsider: User, acme: Organization, globex: Organization
) -> None:
    Membership.objects.create(user=owner, organization=globex, role=Role.MEMBER)
    old = Token.objects.create(user=owner).key
    client = browser(owner)
    page = client.get("/account").content.decode()
    assert 'data-org="acme"' in page
    assert 'data-org="globex"' in page
    assert old not in page  # the token is shown only when made
    assert 'href="/account/password"' in page

    response = client.post("/account/token", follow=True)
    match = re.search(r"Your new API token .*: ([0-9a-f]{40})", shown(response))
    assert match is not None, shown(response)
    new = match.group(1)
    assert new != old
    assert Token.objects.get(user=owner).key == new
    assert new not in client.get("/account").content.decode()

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {old}")
    assert api.get("/api/v1/orgs").status_code == 401
    api.credentials(HTTP_AUTHORIZATION=f"Token {new}")
    assert api.get("/api/v1/orgs").status_code == 200


def test_the_password_change_is_djangos_own(teammate: User, acme: Organization) -> None:
    client = browser(teammate)
    assert client.get("/account/password").status_code == 200
    wrong = client.post(
        "/account/password",
        {"old_password": "nope", "new_password1": "a-long-new-pass-9", "new_password2": "a-long-new-pass-9"},
    )
    assert wrong.status_code == 200  # the form again, with its error
    response = client.post(
        "/account/password",
        {"old_password": "pw-teammate", "new_password1": "a-long-new-pass-9", "new_password2": "a-long-new-pass-9"},
        follow=True,
    )
    assert "Password changed" in shown(response)
    teammate.refresh_from_db()
    assert teammate.check_password("a-long-new-pass-9")


def test_the_account_page_of_someone_in_no_org_and_of_a_super_admin(root: User, acme: Organization) -> None:
    loner = User.objects.create_user(username="loner", password="pw-loner")
    page = browser(loner).get("/account").content.decode()
    assert "You belong to no organization yet" in page
    assert 'href="/account"' in page  # the username in the header leads here
    page = browser(root).get("/account").content.decode()
    assert "you act as admin of every organization" in page
    assert 'href="/orgs/acme/members"' in page  # the nav keeps the org's links
