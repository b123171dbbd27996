"""The page frame in a real browser (issue 24, deliverable 7): local times with UTC on hover, confirmations,
the styled 404 with its nav, the favicon, the super-admin's landing org.

Every situation is made for real, through the services or the runner protocol,
against the live server the browser talks to.
"""

from __future__ import annotations

import re
from datetime import UTC
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Dialog, Page, expect

from gantry.core.models import Membership, Organization, Role, RunnerGroup, RunStatus, Stack
from tests.browser.conftest import Browsers, login, shot
from tests.dispatch.helpers import deploy
from tests.queue.helpers import poll

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]


@pytest.fixture
def people(acme: Organization, globex: Organization) -> dict[str, User]:
    made = {
        "ada": User.objects.create_user(username="ada", password="ada-password-1", is_staff=True),
        "root": User.objects.create_superuser(username="root", password="root-password-1", email="r@example.com"),
    }
    Membership.objects.create(user=made["ada"], organization=acme, role=Role.ADMIN)
    return made


def asking(page: Page, answer: bool) -> list[str]:
    """A page of the same browser without the suite's accept-every-dialog handler: answers ``answer``."""
    asked: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        asked.append(dialog.message)
        if answer:
            dialog.accept()
        else:
            dialog.dismiss()

    page.on("dialog", on_dialog)
    return asked


def test_times_show_local_with_a_relative_form_and_utc_on_hover(
    browsers: Browsers, people: dict[str, User], stack: Stack, group: RunnerGroup
) -> None:
    poll(group)
    run = deploy(stack)
    ada = browsers.open("ada")
    login(ada, "ada", "ada-password-1")
    page = ada.context.new_page()
    # A browser in Tokyo (UTC+9), so local and UTC differ whatever zone this machine is in.
    ada.context.new_cdp_session(page).send("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Tokyo"})
    page.goto("/orgs/acme/queue")
    cell = page.locator(f"tr[data-run='{run.id}'] time")
    expect(cell).to_have_attribute("data-local", "1")
    created = run.created_at.astimezone(UTC)
    local = created.astimezone(ZoneInfo("Asia/Tokyo")).strftime("%Y-%m-%d %H:%M")
    expect(cell).to_have_text(re.compile(rf"^{local} \((just now|\d+ s ago)\)$"))
    expect(cell).to_have_attribute("title", created.strftime("%Y-%m-%d %H:%M:%S UTC"))
    cell.hover()
    shot(page, "frame-queue-local-time")
    # The live part is re-rendered every 3 s with UTC text; the script converts it again.
    page.evaluate("() => document.querySelector('[data-live] time').removeAttribute('data-local')")
    expect(page.locator("[data-live] time").first).to_have_attribute("data-local", "1", timeout=10_000)
    expect(page.locator(f"tr[data-run='{run.id}'] time")).to_have_text(re.compile(rf"^{local} "))


def test_a_dismissed_confirmation_cancels_nothing_and_an_accepted_one_cancels(
    browsers: Browsers, people: dict[str, User], stack: Stack
) -> None:
    run = deploy(stack)  # waiting (pending: the lane is free), so Cancel and Skip are both shown
    waiting = run.status
    assert waiting == RunStatus.PENDING
    ada = browsers.open("ada")
    login(ada, "ada", "ada-password-1")
    page = ada.context.new_page()  # no accept-everything handler on this one
    asked = asking(page, answer=False)
    page.goto(f"/runs/{run.id}")
    expect(page.locator("[data-cancel-vs-skip]")).to_contain_text("Skip")
    page.click("button[data-action=cancel]")
    assert asked
    assert asked[0].startswith("Cancel this run?")
    page.wait_for_timeout(500)
    run.refresh_from_db()
    assert run.status == waiting
    expect(page.locator(".messages")).to_have_count(0)

    page.click("button[data-action=skip]")  # the skip asks too; "no" again
    assert len(asked) == 2
    assert asked[1].startswith("Skip this deployment?")
    run.refresh_from_db()
    assert run.status == waiting

    yes = ada.context.new_page()
    asking(yes, answer=True)
    yes.goto(f"/runs/{run.id}")
    yes.click("button[data-action=cancel]")
    expect(yes.locator(".messages")).to_contain_text("Cancellation asked")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_another_orgs_page_is_a_styled_404_that_keeps_the_nav(
    browsers: Browsers, people: dict[str, User], globex: Organization
) -> None:
    ada = browsers.open("ada")
    login(ada, "ada", "ada-password-1")
    response = ada.goto("/orgs/globex/queue")
    assert response is not None
    assert response.status == 404
    expect(ada.locator("[data-error-page='404'] h1")).to_contain_text("Not found")
    expect(ada.locator("header.top nav a", has_text="Queue")).to_have_attribute("href", "/orgs/acme/queue")
    expect(ada.locator("header.top nav a", has_text="Runner groups")).to_have_attribute(
        "href", "/orgs/acme/runner-groups"
    )
    # Styled: the site's sheet applies (the header's dark band).
    band = ada.locator("header.top").evaluate("(el) => getComputedStyle(el).backgroundColor")
    assert band == "rgb(18, 50, 95)"
    shot(ada, "frame-404")


def test_the_favicon_is_served(browsers: Browsers, people: dict[str, User]) -> None:
    ada = browsers.open("ada")
    response = ada.goto("/favicon.ico")
    assert response is not None
    assert response.status == 200  # after the redirect to the SVG
    assert response.url.endswith("web/favicon.svg")
    login(ada, "ada", "ada-password-1")
    href = ada.locator("link[rel=icon]").get_attribute("href")
    assert href is not None
    icon = ada.request.get(href)
    assert icon.status == 200
    assert b"<svg" in icon.body()


def test_a_super_admin_lands_on_an_org_they_belong_to(
    browsers: Browsers, people: dict[str, User], acme: Organization, globex: Organization
) -> None:
    Organization.objects.create(slug="aardvark", name="Aardvark")  # first of all orgs by slug
    Membership.objects.create(user=people["root"], organization=globex, role=Role.ADMIN)
    root = browsers.open("root")
    login(root, "root", "root-password-1")
    expect(root).to_have_url(re.compile(r"/orgs/globex/queue$"))
    root.goto("/invitations")  # a page outside any org keeps the landing org's links
    expect(root.locator("header.top nav a", has_text="Queue")).to_have_attribute("href", "/orgs/globex/queue")
