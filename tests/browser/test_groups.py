"""The runner-group pages in a real browser (issue 24, deliverable 4 and the groups part of 6).

An org admin creates a group from the groups page and sees its token once with
the commands that start a coordinator; a coordinator polls the live server
with that token, naming itself as runners/coordinator.py does, and shows up on
the group's page; a silent runner is force-deleted from there once the gate
allows; the group is archived and its coordinator's next poll is refused. A
member sees the pages without one admin button.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from gantry import conf
from gantry import redis as gantry_redis
from gantry.core import services
from gantry.core.models import Membership, Organization, Role, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch import coordinators
from gantry.dispatch.claim import claim
from gantry_wire import protocol
from runners.client import ApiError, GantryClient
from runners.coordinator import identity_headers
from tests.browser.conftest import Browsers, login, shot
from tests.dispatch.helpers import deploy, make_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]


@pytest.fixture
def people(acme: Organization) -> dict[str, User]:
    made = {
        "ada": User.objects.create_user(username="ada", password="ada-password-1"),
        "bob": User.objects.create_user(username="bob", password="bob-password-1"),
    }
    Membership.objects.create(user=made["ada"], organization=acme, role=Role.ADMIN)
    Membership.objects.create(user=made["bob"], organization=acme, role=Role.MEMBER)
    return made


@pytest.fixture(autouse=True)
def _no_recorded_coordinators() -> None:
    # Group ids repeat from test to test; what an earlier test's coordinators left must not show.
    client = gantry_redis.client()
    keys = list(client.scan_iter(match=coordinators.KEY_PREFIX + "*"))
    if keys:
        client.delete(*keys)
    coordinators.forget_writes()


def asked(page: Page) -> list[str]:
    """The confirmation questions the page asks (the harness accepts each)."""
    questions: list[str] = []
    page.on("dialog", lambda d: questions.append(d.message))
    return questions


def coordinator_client(server: str, token: str, instance: str) -> GantryClient:
    """A coordinator's client, naming itself on the poll as runners/coordinator.py does."""
    client = GantryClient(server, token, timeout=10)
    client.poll_headers = identity_headers(instance, host="build-7.example")
    return client


def test_an_admin_creates_a_group_sees_its_token_once_and_its_coordinator(
    browsers: Browsers, people: dict[str, User], acme: Organization, live_server: Any
) -> None:
    admin = browsers.open("ada")
    login(admin, "ada", "ada-password-1")
    admin.goto("/orgs/acme/runner-groups")
    form = admin.locator("form[data-new-group]")
    form.locator("input[name=name]").fill("arm-builders")
    form.locator("textarea[name=labels]").fill("os=linux, arch=arm64")
    form.locator("input[name=max_concurrent_runs]").fill("4")
    form.locator("button[data-action=create-group]").click()

    group = RunnerGroup.objects.get(organization=acme, name="arm-builders")
    expect(admin).to_have_url(f"{live_server.url}/runner-groups/{group.id}")
    assert group.labels == {"os": "linux", "arch": "arm64"}
    assert group.max_concurrent_runs == 4
    panel = admin.locator("[data-new-token]")
    token = panel.locator("[data-token]").inner_text().strip()
    for launcher in ("local", "docker", "kubernetes"):
        command = panel.locator(f"[data-launcher={launcher}] pre").inner_text()
        assert f"export GANTRY_GROUP_TOKEN={token}" in command
        assert f"--server {live_server.url}" in command
        assert f"--launcher {launcher}" in command
    shot(admin, "group-created")

    # The token works: a coordinator polls with it, naming itself, and the page lists it.
    poller = coordinator_client(live_server.url, token, "b7e1c0de")
    assert poller.poll(wait=0) is None
    admin.reload()
    expect(admin.locator("[data-new-token]")).to_have_count(0)  # shown once
    row = admin.locator("tr[data-coordinator=b7e1c0de]")
    expect(row).to_contain_text("build-7.example")
    expect(row).to_contain_text(protocol.VERSION)
    expect(row).to_contain_text("online")
    expect(admin.locator("[data-slots]")).to_contain_text("0 of 4 slots in use")
    shot(admin, "group")

    admin.goto("/orgs/acme/runner-groups")
    listed = admin.locator(f"tr[data-group='{group.id}']")
    expect(listed.locator("[data-coordinators]")).to_contain_text("1 online")
    expect(listed.locator("[data-slots]")).to_have_text("0 / 4")
    listed.locator(f"a[href='/runner-groups/{group.id}']").click()
    expect(admin).to_have_url(f"{live_server.url}/runner-groups/{group.id}")
    admin.goto("/orgs/acme/runner-groups")
    shot(admin, "groups")


def test_an_admin_force_deletes_a_silent_runner_from_the_group_page_once_the_gate_allows(
    browsers: Browsers, people: dict[str, User], acme: Organization, group: RunnerGroup
) -> None:
    run = deploy(make_stack(acme, "app", {"os": "linux"}))
    won = claim(group=group)
    assert won is not None
    services.runner_ready(runner_id=won.runner_id, metadata={"hostname": "box-3", "launcher": "local", "pid": 7})
    services.run_accept(run_id=run.id, runner_id=won.runner_id)
    admin = browsers.open("ada")
    questions = asked(admin)
    login(admin, "ada", "ada-password-1")

    admin.goto(f"/runner-groups/{group.id}")
    row = admin.locator(f"tr[data-runner='{won.runner_id}']")
    expect(row).to_contain_text("box-3")
    expect(row.locator(f"a[href='/runs/{run.id}']")).to_have_count(1)
    expect(row).to_contain_text("force-delete from")  # seen just now: not yet
    expect(row.locator("button[data-action=force-delete]")).to_have_count(0)

    # The machine dies: its runner stops reporting, past the gate.
    gone = timezone.now() - timedelta(seconds=conf.get().runner_force_gate + 5)
    Runner.objects.filter(id=won.runner_id).update(last_seen_at=gone)
    admin.reload()
    admin.locator(f"tr[data-runner='{won.runner_id}'] button[data-action=force-delete]").click()

    expect(admin.locator(".messages")).to_contain_text("force-deleted")
    assert questions
    assert "Force-delete this runner?" in questions[-1]
    assert not Runner.objects.filter(id=won.runner_id).exists()
    assert Run.objects.get(id=run.id).status == RunStatus.FAILURE
    expect(admin.locator(f"tr[data-runner='{won.runner_id}']")).to_have_count(0)


def test_an_admin_archives_a_group_and_its_coordinators_next_poll_is_refused(
    browsers: Browsers, people: dict[str, User], acme: Organization, live_server: Any
) -> None:
    group, token = services.runner_group_create(org=acme, name="retiring", labels={"os": "linux"})
    poller = coordinator_client(live_server.url, token, "0ld")
    assert poller.poll(wait=0) is None
    admin = browsers.open("ada")
    questions = asked(admin)
    login(admin, "ada", "ada-password-1")
    admin.goto(f"/runner-groups/{group.id}")
    expect(admin.locator("tr[data-coordinator='0ld']")).to_have_count(1)

    admin.locator("button[data-action=archive]").click()

    expect(admin).to_have_url(f"{live_server.url}/orgs/acme/runner-groups")
    expect(admin.locator(".messages")).to_contain_text("retiring archived")
    assert questions
    assert questions[-1].startswith("Archive retiring?")
    expect(admin.locator(f"tr[data-group='{group.id}']")).to_have_count(0)
    with pytest.raises(ApiError) as refused:
        poller.poll(wait=0)
    assert refused.value.status == 401
    assert RunnerGroup.objects.get(id=group.id).archived_at is not None


def test_a_member_sees_the_group_pages_without_an_admin_button(
    browsers: Browsers, people: dict[str, User], acme: Organization, group: RunnerGroup
) -> None:
    runner = Runner.objects.create(runner_group=group, hostname="old-box",
                                   last_seen_at=timezone.now() - timedelta(days=1))  # fmt: skip
    member = browsers.open("bob", width=390, height=844)  # a phone
    login(member, "bob", "bob-password-1")

    member.goto("/orgs/acme/runner-groups")
    expect(member.locator(f"tr[data-group='{group.id}']")).to_have_count(1)
    expect(member.locator("form[data-new-group]")).to_have_count(0)
    member.goto(f"/runner-groups/{group.id}")
    expect(member.locator(f"tr[data-runner='{runner.id}']")).to_contain_text("old-box")
    assert member.locator("button[data-action]").count() == 0
    shot(member, "group-member-phone")

    # Pressing them anyway (a crafted POST) is refused, and nothing changes.
    statuses = member.evaluate(
        """async ([id, runner]) => {
            const csrf = document.cookie.match(/csrftoken=([^;]+)/)[1];
            const post = async (url) => (await fetch(url, {method: 'POST', headers: {'X-CSRFToken': csrf}})).status;
            return [await post(`/runner-groups/${id}/archive`),
                    await post(`/runner-groups/${id}/runners/${runner}/force-delete`),
                    await post('/orgs/acme/runner-groups/new')];
        }""",
        [group.id, str(runner.id)],
    )
    assert statuses == [403, 403, 403]
    assert RunnerGroup.objects.get(id=group.id).archived_at is None
    assert Runner.objects.filter(id=runner.id).exists()
