"""The pages in a real browser: an org admin, a member and a super-admin at work (issue: the queue page).

Every situation is made for real, through the services or the runner protocol
(the same API a coordinator and a runner call), against the live server the
browser talks to.
"""

from __future__ import annotations

import base64
import gzip
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Membership, Organization, Role, RunnerGroup, Stack
from tests.browser.conftest import Browsers, login, shot
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.queue.helpers import poll, spend_budget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]


@pytest.fixture
def people(acme: Organization, globex: Organization) -> dict[str, User]:
    made = {
        "ada": User.objects.create_user(username="ada", password="ada-password-1", is_staff=True),
        "bob": User.objects.create_user(username="bob", password="bob-password-1"),
        "root": User.objects.create_superuser(username="root", password="root-password-1", email="r@example.com"),
    }
    Membership.objects.create(user=made["ada"], organization=acme, role=Role.ADMIN)
    Membership.objects.create(user=made["bob"], organization=acme, role=Role.MEMBER)
    return made


def runner_start(claim: dict[str, Any]) -> APIClient:
    """The ephemeral runner's first calls, over the protocol: ready, accept. Answers its client."""
    runner = APIClient()
    runner.credentials(HTTP_AUTHORIZATION=f"Bearer {claim['runner_token']}")
    assert runner.post(f"/api/v1/runners/{claim['runner_id']}/ready", {}, format="json").status_code == 204
    assert runner.post(f"/api/v1/runs/{claim['run_id']}/accept", {}, format="json").status_code == 200
    return runner


def push_live(runner: APIClient, run_id: str, text: str) -> None:
    data = base64.b64encode(gzip.compress(text.encode())).decode()
    body = {"chunk_index": 0, "sealed_chunks": 0, "data": data}
    assert runner.post(f"/api/v1/runs/{run_id}/logs/live", body, format="json").status_code == 204


def reason_cell(page: Page, run_id: str) -> Any:
    return page.locator(f"tr[data-run='{run_id}'] td.reason .code")


def test_the_banner_and_a_reason_follow_the_budget_and_the_rate(
    browsers: Browsers, people: dict[str, User], acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    poll(group)  # the coordinator is up
    run = deploy(stack)
    admin = browsers.open("ada")
    login(admin, "ada", "ada-password-1")
    expect(admin).to_have_url(re.compile(r"/orgs/acme/queue$"))  # the site root leads to the queue
    expect(reason_cell(admin, str(run.id))).to_have_text("dispatchable")
    expect(admin.locator("[data-banner]")).to_contain_text("runs may dispatch now")
    shot(admin, "queue-dispatchable")

    # The budget empties: the page refreshes itself to say so, and why the run waits.
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    spend_budget(acme)
    expect(admin.locator("[data-banner] [data-throttled]")).to_contain_text("throttled until", timeout=10_000)
    # In words: "next slot in 58 min", not "3526 s".
    expect(admin.locator("[data-banner]")).to_contain_text(re.compile(r"next slot in \d+ (s|min|h)"))
    expect(reason_cell(admin, str(run.id))).to_have_text("org_throttled", timeout=10_000)
    assert admin.locator("form.rate").count() == 0  # only a super-admin changes the rate
    shot(admin, "queue-throttled")

    # A super-admin raises the rate from the same page.
    root = browsers.open("root")
    login(root, "root", "root-password-1")
    root.goto("/orgs/acme/queue")
    root.fill("input[name=runs_per_hour_limit]", "1000000")
    root.click("form.rate button[type=submit]")
    expect(root.locator(".messages")).to_contain_text("1000000 runs per hour")
    shot(root, "queue-super-admin")

    # (The group's one poll, above, is recent enough: a second would take the run.)
    expect(admin.locator("[data-banner]")).to_contain_text("runs may dispatch now", timeout=10_000)
    expect(reason_cell(admin, str(run.id))).to_have_text("dispatchable", timeout=10_000)


def test_a_running_runs_log_follows_live_and_it_can_be_cancelled(
    browsers: Browsers, people: dict[str, User], stack: Stack, group: RunnerGroup
) -> None:
    run = deploy(stack)
    claim = poll(group)
    assert claim is not None
    runner = runner_start(claim)
    push_live(runner, claim["run_id"], "step 1 of 3\n")

    page = browsers.open("bob")
    login(page, "bob", "bob-password-1")
    page.goto("/orgs/acme/queue")
    expect(page.locator(f"tr[data-run='{run.id}']")).to_contain_text("linux")  # running, on its group
    page.click(f"tr[data-run='{run.id}'] a")
    expect(page.locator("[data-run-status]")).to_have_text("running")
    log = page.locator("pre.log")
    expect(log).to_have_text("step 1 of 3\n")

    push_live(runner, claim["run_id"], "step 1 of 3\nstep 2 of 3\n")
    expect(log).to_have_text("step 1 of 3\nstep 2 of 3\n", timeout=10_000)  # no reload
    # Local time to the second, and how long ago (gantry.js).
    expect(page.locator(".timeline")).to_contain_text(
        re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \((just now|\d+ s ago)\) accepted")
    )
    shot(page, "run-running")

    page.click("button[data-action=cancel]")
    expect(page.locator(".messages")).to_contain_text("Cancellation asked")
    expect(page.locator("[data-run-status]")).to_have_text("requested_cancellation")
    shot(page, "run-cancelling")
    # The runner sees it on its status poll, as it would for a cancellation through the API.
    status = runner.get(f"/api/v1/runs/{claim['run_id']}/status").json()
    assert status["cancel_requested"] is True


def test_a_member_gets_no_admin_buttons_and_no_other_orgs_pages(
    browsers: Browsers, people: dict[str, User], globex: Organization, group: RunnerGroup
) -> None:
    member = browsers.open("bob", width=390, height=844)  # a phone
    login(member, "bob", "bob-password-1")
    member.goto("/orgs/acme/runner-groups")
    row = member.locator(f"tr[data-group='{group.id}']")
    expect(row).to_contain_text("never polled")
    assert member.locator("button[data-action=drain], button[data-action=rotate-token]").count() == 0
    shot(member, "runner-groups-member-phone")
    # Posting the form anyway is refused, and nothing changes.
    status = member.evaluate(
        """async (id) => {
            const csrf = document.querySelector('input[name=csrfmiddlewaretoken]').value;
            const r = await fetch(`/runner-groups/${id}/drain`, {method: 'POST', headers: {'X-CSRFToken': csrf}});
            return r.status;
        }""",
        group.id,
    )
    assert status == 403
    assert not RunnerGroup.objects.get(id=group.id).drained
    globex_stack = make_stack(globex, "api")
    other_run = deploy(globex_stack)
    for path in ("/orgs/globex/queue", "/orgs/globex/runner-groups", f"/runs/{other_run.id}"):
        assert member.goto(path).status == 404  # type: ignore[union-attr]


def test_an_org_admin_drains_and_rotates_and_sees_the_token_once(
    browsers: Browsers, people: dict[str, User], acme: Organization, group: RunnerGroup
) -> None:
    make_group(acme, "spare", {"os": "linux"})
    admin = browsers.open("ada")
    login(admin, "ada", "ada-password-1")
    admin.goto("/orgs/acme/runner-groups")
    row = admin.locator(f"tr[data-group='{group.id}']")
    row.locator("button[data-action=drain]").click()
    expect(admin.locator(f"tr[data-group='{group.id}']")).to_contain_text("drained")
    assert RunnerGroup.objects.get(id=group.id).drained
    admin.locator(f"tr[data-group='{group.id}'] button[data-action=rotate-token]").click()
    message = admin.locator(".messages")
    expect(message).to_contain_text("shown once")
    token = message.inner_text().rsplit(": ", 1)[1].strip()
    shot(admin, "runner-groups-admin")
    coordinator = APIClient()
    coordinator.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert coordinator.get("/api/v1/runner-groups/demand").status_code == 200
    admin.reload()
    expect(admin.locator(".messages")).to_have_count(0)  # never shown again


def test_a_new_user_sets_a_password_and_an_invited_one_accepts(
    browsers: Browsers, people: dict[str, User], acme: Organization, globex: Organization
) -> None:
    owner = APIClient()
    owner.force_authenticate(people["ada"])
    link = owner.post("/api/v1/orgs/acme/members", {"username": "cleo", "role": "member"}, format="json").json()
    page = browsers.open("cleo", width=390, height=844)
    page.goto(urlsplit(link["set_password_url"]).path)  # made for the in-process client's host
    shot(page, "set-password-phone")
    page.fill("input[name=new_password1]", "cleo-long-password")
    page.fill("input[name=new_password2]", "cleo-long-password")
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/orgs/acme/queue$"))
    shot(page, "queue-phone")

    # cleo, now with an account, is invited to globex by a super-admin and says yes.
    root = APIClient()
    root.force_authenticate(people["root"])
    assert (
        root.post("/api/v1/orgs/globex/members", {"username": "cleo", "role": "member"}, format="json").status_code
        == 202
    )
    page.goto("/orgs/globex/queue")
    assert page.locator("h1").inner_text() != "Queue"  # 404: not a member until she accepts
    page.goto("/invitations")
    expect(page.locator("table")).to_contain_text("globex")
    shot(page, "invitations-phone")
    page.click("button:has-text('Accept')")
    expect(page).to_have_url(re.compile(r"/orgs/globex/queue$"))

    page.click("text=Log out")
    expect(page).to_have_url(re.compile(r"/login"))
    shot(page, "login")
