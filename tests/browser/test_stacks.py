"""The stack pages in a real browser (issue 24, deliverable 1): deploy and see it run, run again, history, archive.

Runs execute for real through the runner protocol (a poll of the group, then
ready, accept and done, as a coordinator and its runner call them), against
the live server the browser talks to.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Deployment, Membership, Organization, Role, Run, RunnerGroup, Stack
from tests.browser.conftest import Browsers, login, shot
from tests.browser.test_pages import runner_start
from tests.queue.helpers import poll

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]

OLD_SPEC = {"steps": [{"name": "build", "run": "make"}, {"name": "ship", "run": "make ship"}], "timeout_seconds": 600}


@pytest.fixture
def people(acme: Organization) -> dict[str, User]:
    made = {
        "ada": User.objects.create_user(username="ada", password="ada-password-1", is_staff=True),
        "bob": User.objects.create_user(username="bob", password="bob-password-1"),
    }
    Membership.objects.create(user=made["ada"], organization=acme, role=Role.ADMIN)
    Membership.objects.create(user=made["bob"], organization=acme, role=Role.MEMBER)
    return made


def execute(group: RunnerGroup, run_id: str, outcome: str = "succeeded") -> None:
    """The group's coordinator claims the run and its runner runs it to ``outcome``."""
    claim = poll(group)
    assert claim is not None
    assert claim["run_id"] == run_id
    runner: APIClient = runner_start(claim)
    body = {"outcome": outcome, "exit_code": 0 if outcome == "succeeded" else 1, "sealed_chunks": 0}
    assert runner.post(f"/api/v1/runs/{run_id}/done", body, format="json").status_code in (200, 204)


def run_id_of(page: Page) -> str:
    match = re.search(r"/runs/([0-9a-f-]{36})$", page.url)
    assert match is not None, page.url
    return match.group(1)


def test_a_member_deploys_from_the_stacks_page_sees_it_succeed_and_runs_it_again(
    browsers: Browsers, people: dict[str, User], acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    services.stack_create(org=acme, name="docs", spec={"steps": [{"name": "build", "run": "mkdocs build"}]})
    page = browsers.open("bob")
    login(page, "bob", "bob-password-1")
    page.click("nav >> text=Stacks")
    expect(page).to_have_url(re.compile(r"/orgs/acme/stacks$"))
    expect(page.locator(f"tr[data-stack='{stack.id}']")).to_contain_text("never deployed")

    page.click(f"tr[data-stack='{stack.id}'] button[data-action=deploy]")
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f-]{36}$"))
    expect(page.locator(".messages")).to_contain_text("Deployed web: its run is pending.")
    first = run_id_of(page)
    assert Deployment.objects.get(runs__id=first).created_by == people["bob"]

    execute(group, first)
    expect(page.locator("[data-run-status]")).to_have_text("succeeded", timeout=10_000)  # the page follows
    # Run again appears once the run has finished: a new deployment of the same spec.
    expect(page.locator("button[data-action=run-again]")).to_be_visible()
    shot(page, "run-again")
    page.click("button[data-action=run-again]")
    expect(page.locator(".messages")).to_contain_text("Deployed web")
    again = run_id_of(page)
    assert again != first
    assert Run.objects.get(id=again).deployment_id != Run.objects.get(id=first).deployment_id

    page.goto("/orgs/acme/stacks")
    expect(page.locator(f"tr[data-stack='{stack.id}'] [data-last-run='{again}']")).to_contain_text("pending")
    expect(page.locator(f"tr[data-stack='{stack.id}'] time")).to_have_attribute("datetime", re.compile(r"^\d{4}-"))
    assert page.locator("button[data-action=archive]").count() == 0
    shot(page, "stacks")


def test_an_admin_reads_the_filtered_history_deploys_an_earlier_spec_and_archives_the_stack(
    browsers: Browsers, people: dict[str, User], acme: Organization, stack: Stack, group: RunnerGroup
) -> None:
    # History: one run of an older spec that failed, one of the current spec that succeeded, one waiting.
    old = services.deployment_create(stack=stack, spec=OLD_SPEC, created_by=people["ada"])
    old_run = str(Run.objects.get(deployment=old).id)
    execute(group, old_run, "failure")
    ok = services.deployment_create(stack=stack, created_by=people["bob"])
    ok_run = str(Run.objects.get(deployment=ok).id)
    execute(group, ok_run)
    services.stack_set_secrets(stack=stack, changes={"DEPLOY_TOKEN": "never-shown-1234"})

    page = browsers.open("ada")
    login(page, "ada", "ada-password-1")
    page.goto(f"/stacks/{stack.id}")
    expect(page.locator("[data-secrets]")).to_contain_text("DEPLOY_TOKEN")
    assert "never-shown-1234" not in page.content()
    expect(page.locator("table.history tbody tr")).to_have_count(2)
    expect(page.locator(f"tr[data-run='{ok_run}']")).to_contain_text("bob")
    shot(page, "stack")

    page.select_option("select[name=status]", "failure")
    page.click("form[data-filters] button[type=submit]")
    expect(page).to_have_url(re.compile(r"status=failure"))
    expect(page.locator("table.history tbody tr")).to_have_count(1)
    expect(page.locator(f"tr[data-run='{old_run}']")).to_contain_text("ada")
    shot(page, "stack-filtered")

    # An admin deploys the older run's spec again.
    page.goto(f"/stacks/{stack.id}")
    page.select_option("select[name=spec_from_run]", old_run)
    page.click("button[data-action=deploy-spec]")
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f-]{36}$"))
    redeployed = run_id_of(page)
    assert Run.objects.get(id=redeployed).deployment.spec["steps"][1]["name"] == "ship"

    # Archive: asked first (the dialog is accepted), then the stack leaves the list; its waiting run is cancelled.
    page.goto(f"/stacks/{stack.id}")
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    page.click("button[data-action=archive]")
    expect(page).to_have_url(re.compile(r"/orgs/acme/stacks$"))
    expect(page.locator(".messages")).to_contain_text("Stack web archived")
    assert dialogs
    assert dialogs[0].startswith("Archive web?")
    assert page.locator(f"tr[data-stack='{stack.id}']").count() == 0
    assert Run.objects.get(id=redeployed).status == "cancelled"
    page.goto(f"/stacks/{stack.id}")
    expect(page.locator("[data-archived]")).to_contain_text("Archived")
    expect(page.locator("table.history tbody tr")).to_have_count(3)
