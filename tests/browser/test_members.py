"""The members and account pages in a real browser: an org admin runs the org's people, a member reads and leaves.

Every button is pressed as a person would (confirmation dialogs accepted);
what the buttons did is then checked in the database and, for the API token,
against the live server's API.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from rest_framework.authtoken.models import Token

from gantry.core.models import Invitation, Membership, Organization, Role
from tests.browser.conftest import Browsers, login, shot

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def people(acme: Organization, globex: Organization) -> dict[str, User]:
    made = {
        "ada": User.objects.create_user(username="ada", password="ada-password-1", is_staff=True),
        "bob": User.objects.create_user(username="bob", password="bob-password-1", email="bob@example.com"),
        "cyd": User.objects.create_user(username="cyd", password="cyd-password-1", email="cyd@example.com"),
    }
    Membership.objects.create(user=made["ada"], organization=acme, role=Role.ADMIN)
    Membership.objects.create(user=made["bob"], organization=acme, role=Role.MEMBER)
    Membership.objects.create(user=made["cyd"], organization=globex, role=Role.ADMIN)
    return made


def roles(org: Organization) -> dict[str, str]:
    return dict(Membership.objects.filter(organization=org).values_list("user__username", "role"))


def asked(page: Page) -> list[str]:
    """The confirmation questions the page asks (the browsers fixture accepts each one)."""
    questions: list[str] = []
    page.on("dialog", lambda d: questions.append(d.message))
    return questions


def api_status(base_url: str, token: str) -> int:
    request = urllib.request.Request(f"{base_url}/api/v1/orgs", headers={"Authorization": f"Token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            json.load(response)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_an_admin_invites_changes_a_role_removes_and_is_refused_removing_the_last_admin(
    browsers: Browsers, people: dict[str, User], acme: Organization
) -> None:
    admin = browsers.open("ada")
    questions = asked(admin)
    login(admin, "ada", "ada-password-1")
    admin.click("nav >> text=Members")
    expect(admin).to_have_url(re.compile(r"/orgs/acme/members$"))
    expect(admin.locator("h1")).to_contain_text("2 members")

    # An existing user, by email: invited, not attached.
    admin.fill("form.invite input[name=who]", "CYD@example.com")
    admin.select_option("form.invite select[name=role]", "admin")
    admin.click("button[data-action=invite]")
    expect(admin.locator(".messages")).to_contain_text("Invited cyd as admin")
    expect(admin.locator("tr[data-invitation='cyd']")).to_contain_text("admin")
    assert Invitation.objects.get(user=people["cyd"]).role == Role.ADMIN
    assert "cyd" not in roles(acme)

    # A new email: an account at once, and a one-time set-password link for the admin to pass on.
    admin.fill("form.invite input[name=who]", "dana@example.com")
    admin.select_option("form.invite select[name=role]", "member")
    admin.click("button[data-action=invite]")
    message = admin.locator(".messages li.warning")
    expect(message).to_contain_text("one-time link")
    link = re.search(r"https?://\S+/set-password/\S+", message.inner_text())
    assert link is not None
    expect(admin.locator("tr[data-member='dana@example.com']")).to_contain_text("no password set yet")
    dana = browsers.open("dana")
    dana.goto(link.group(0))
    dana.fill("input[name=new_password1]", "dana-long-password-1")
    dana.fill("input[name=new_password2]", "dana-long-password-1")
    dana.click("button[type=submit]")
    expect(dana).to_have_url(re.compile(r"/orgs/acme/queue$"))  # logged in, in the org
    admin.reload()
    assert "set-password" not in admin.content()  # shown once

    # Change bob's role, then take it back.
    row = admin.locator("tr[data-member='bob']")
    expect(row.locator("select[name=role]")).to_be_visible()
    row.locator("select[name=role]").select_option("admin")
    row.locator("button[data-action=role]").click()
    expect(admin.locator(".messages")).to_contain_text("bob is admin now")
    expect(admin.locator("tr[data-member='bob'] td[data-role]")).to_have_text("admin")
    admin.locator("tr[data-member='bob'] select[name=role]").select_option("member")
    admin.locator("tr[data-member='bob'] button[data-action=role]").click()
    expect(admin.locator("tr[data-member='bob'] td[data-role]")).to_have_text("member")
    shot(admin, "members")

    # Remove bob: the page asks first.
    admin.locator("tr[data-member='bob'] button[data-action=remove]").click()
    expect(admin.locator(".messages")).to_contain_text("bob was removed from acme")
    assert questions[-1].startswith("Remove bob from acme?")
    expect(admin.locator("tr[data-member='bob']")).to_have_count(0)
    assert "bob" not in roles(acme)

    # The last admin can neither step down nor leave: the refusal is a message, nothing changes.
    admin.locator("tr[data-member='ada'] select[name=role]").select_option("member")
    admin.locator("tr[data-member='ada'] button[data-action=role]").click()
    expect(admin.locator(".messages li.error")).to_contain_text("ada is the last admin of acme")
    admin.locator("tr[data-member='ada'] button[data-action=leave]").click()
    expect(admin.locator(".messages li.error")).to_contain_text("last admin")
    assert roles(acme)["ada"] == "admin"
    shot(admin, "members-last-admin")


def test_a_member_reads_the_list_has_no_admin_buttons_and_a_crafted_post_is_403(
    browsers: Browsers, people: dict[str, User], acme: Organization
) -> None:
    Invitation.objects.create(user=people["cyd"], organization=acme, role=Role.MEMBER, invited_by=people["ada"])
    page = browsers.open("bob")
    login(page, "bob", "bob-password-1")
    page.goto("/orgs/acme/members")
    expect(page.locator("tr[data-member='ada']")).to_contain_text("admin")
    expect(page.locator("tr[data-invitation='cyd']")).to_be_visible()
    for selector in ("form.invite", "button[data-action=role]", "button[data-action=remove]", "[data-action=revoke]"):
        expect(page.locator(selector)).to_have_count(0)
    expect(page.locator("tr[data-member='bob'] button[data-action=leave]")).to_be_visible()
    shot(page, "members-as-member")

    # The admin's buttons, crafted with the page's own CSRF token: refused.
    for path in ("/orgs/acme/members/ada/remove", "/orgs/acme/members/bob/role", "/orgs/acme/members/invite"):
        answer = page.evaluate(
            """async (path) => {
                const body = new FormData();
                body.append("csrfmiddlewaretoken", document.querySelector("[name=csrfmiddlewaretoken]").value);
                body.append("role", "admin");
                body.append("who", "eve@example.com");
                const r = await fetch(path, {method: "POST", body, credentials: "same-origin"});
                const page = new DOMParser().parseFromString(await r.text(), "text/html");
                const detail = page.querySelector("[data-error-page='403'] [data-detail]");
                return [r.status, detail && detail.textContent];
            }""",
            path,
        )
        assert answer == [403, "This needs the org admin role"], (path, answer)  # the styled 403 page
    assert roles(acme) == {"ada": "admin", "bob": "member"}
    assert not User.objects.filter(username="eve@example.com").exists()

    # Leaving is a member's own: asked first, then back to a page without the org.
    page.click("tr[data-member='bob'] button[data-action=leave]")
    expect(page.locator(".messages")).to_contain_text("You left acme")
    assert roles(acme) == {"ada": "admin"}


def test_a_user_regenerates_their_token_on_the_account_page_and_only_the_new_one_works(
    browsers: Browsers, people: dict[str, User], acme: Organization, live_server: object
) -> None:
    base_url = str(live_server.url)  # type: ignore[attr-defined]
    old = Token.objects.create(user=people["bob"]).key
    assert api_status(base_url, old) == 200

    page = browsers.open("bob")
    questions = asked(page)
    login(page, "bob", "bob-password-1")
    page.click("header a.user")  # the username in the header leads to the account
    expect(page).to_have_url(re.compile(r"/account$"))
    expect(page.locator("[data-username]")).to_have_text("bob")
    expect(page.locator("tr[data-org='acme']")).to_contain_text("member")
    assert old not in page.content()

    page.click("button[data-action=regenerate-token]")
    message = page.locator(".messages li.warning")
    expect(message).to_contain_text("Your new API token")
    assert questions
    assert questions[-1].startswith("Make a new API token?")
    new = re.search(r"[0-9a-f]{40}", message.inner_text())
    assert new is not None
    shot(page, "account")

    assert api_status(base_url, new.group(0)) == 200
    assert api_status(base_url, old) == 401
    page.reload()
    assert new.group(0) not in page.content()  # shown once
    expect(page.locator("a[data-password-change]")).to_be_visible()
