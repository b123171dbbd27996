"""Priority on the pages in a real browser (issue 25): an admin deploys high from a stack's page and the queue
page shows the badge and the run's place in the claim's order."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from gantry.core import services
from gantry.core.models import Membership, Organization, Priority, Role, Run, RunnerGroup, Stack
from gantry.dispatch import queue
from tests.browser.conftest import Browsers, login, shot
from tests.browser.test_stacks import run_id_of
from tests.dispatch.helpers import make_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]


def test_an_admin_deploys_high_and_the_queue_page_shows_it_first_in_line(
    browsers: Browsers, acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    ada = User.objects.create_user(username="ada", password="ada-password-1")
    Membership.objects.create(user=ada, organization=acme, role=Role.ADMIN)
    # A normal run already waits for the same group: the high one goes ahead of it.
    earlier = services.deployment_create(stack=make_stack(acme, "docs", {"os": "linux"}))
    routine = str(Run.objects.get(deployment=earlier).id)

    page = browsers.open("ada")
    login(page, "ada", "ada-password-1")
    page.goto(f"/stacks/{stack.id}")
    expect(page.locator("select[data-deploy-priority] option")).to_have_text(["low", "normal", "high"])
    shot(page, "stack-priority")
    page.locator("section.deploy select[data-deploy-priority]").first.select_option("high")
    page.click("button[data-action=deploy]")
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f-]{36}$"))
    urgent = run_id_of(page)
    assert Run.objects.get(id=urgent).priority == Priority.HIGH
    expect(page.locator("[data-run-priority] [data-priority]")).to_have_text("high")
    expect(page.locator("[data-priority-form]")).to_be_visible()  # an admin may still move it while it waits
    # The page's live part refreshes every 2 s: a choice made in its form must outlive a refresh.
    choice = page.locator("[data-priority-form] select[name=priority]")
    choice.select_option("low")
    page.wait_for_timeout(2500)
    expect(choice).to_have_value("low")
    choice.select_option("high")
    shot(page, "run-priority")

    page.click("nav >> text=Queue")
    expect(page).to_have_url(re.compile(r"/orgs/acme/queue$"))
    badge = page.locator(f"tr[data-run='{urgent}'] .prio[data-priority]")
    expect(badge).to_have_text("high")
    expect(badge).to_have_class(re.compile(r"\bp-high\b"))
    expect(page.locator(f"tr[data-run='{routine}'] .prio[data-priority]")).to_have_text("normal")
    shot(page, "queue-priority")

    if all(e.position is None for e in queue.read_queue(org=acme, now=timezone.now()).entries):
        pytest.skip("the queue read computes no position yet (slice A's queue entry is not merged)")
    # Nothing handed out lately: the place without a time.
    expect(page.locator(f"tr[data-run='{urgent}'] [data-place]")).to_have_text("1st in line for linux")
    expect(page.locator(f"tr[data-run='{routine}'] [data-place]")).to_have_text("2nd in line for linux")
