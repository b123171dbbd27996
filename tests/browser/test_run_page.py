"""The run page in a real browser (issue 24, deliverables 2 and 3): what it says about a run and its runner, and
the log viewer.

Every situation is made for real, through the services or the runner protocol;
time is an argument (a runner's last contact is set back in the database),
never a sleep.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from playwright.sync_api import Page, expect
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.models import Membership, Organization, Role, Run, Runner, RunnerGroup, Stack
from tests.browser.conftest import Browsers, login, shot
from tests.dispatch.helpers import deploy
from tests.queue.helpers import poll

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]

T0 = 1_767_000_000_000  # epoch ms of the log's first line


@pytest.fixture
def people(acme: Organization) -> dict[str, User]:
    made = {
        "ada": User.objects.create_user(username="ada", password="ada-password-1"),
        "bob": User.objects.create_user(username="bob", password="bob-password-1"),
    }
    Membership.objects.create(user=made["ada"], organization=acme, role=Role.ADMIN)
    Membership.objects.create(user=made["bob"], organization=acme, role=Role.MEMBER)
    return made


def start(group: RunnerGroup) -> tuple[dict[str, Any], APIClient]:
    """A runner takes the group's next run: poll, ready (with its host), accept. Answers the claim and its client."""
    claim = poll(group)
    assert claim is not None
    runner = APIClient()
    runner.credentials(HTTP_AUTHORIZATION=f"Bearer {claim['runner_token']}")
    ready = runner.post(f"/api/v1/runners/{claim['runner_id']}/ready", {"hostname": "build-07"}, format="json")
    assert ready.status_code == 204
    assert runner.post(f"/api/v1/runs/{claim['run_id']}/accept", {}, format="json").status_code == 200
    return claim, runner


def silent_since(runner_id: str, seconds: int) -> None:
    """The runner's last contact, ``seconds`` ago (it stopped calling: the machine died)."""
    Runner.objects.filter(id=runner_id).update(last_seen_at=timezone.now() - timedelta(seconds=seconds))


def open_as(browsers: Browsers, name: str, path: str) -> Page:
    page = browsers.open(name)
    login(page, name, f"{name}-password-1")
    page.goto(path)
    return page


def test_a_silent_runner_is_said_plainly_and_an_admin_force_deletes_it_once_the_gate_allows(
    browsers: Browsers, people: dict[str, User], stack: Stack, group: RunnerGroup
) -> None:
    run = Run.objects.get(deployment=services.deployment_create(stack=stack, created_by=people["bob"]))
    claim, runner = start(group)
    data = base64.b64encode(gzip.compress(b"step 1 of 3\n")).decode()
    body = {"chunk_index": 0, "sealed_chunks": 0, "data": data}
    assert runner.post(f"/api/v1/runs/{run.id}/logs/live", body, format="json").status_code == 204

    admin = open_as(browsers, "ada", f"/runs/{run.id}")
    expect(admin.locator("[data-run-status]")).to_have_text("running")
    expect(admin.locator("[data-queued-by]")).to_have_text("bob")  # the deployment's creator
    expect(admin.locator("[data-runner-host]")).to_have_text("build-07")
    expect(admin.locator("[data-log-state]")).to_have_text("Following the log live…")
    expect(admin.locator("[data-silent-warning]")).to_have_count(0)

    # The machine dies: two minutes without a call (three status intervals are 15 s).
    silent_since(claim["runner_id"], 125)
    warning = admin.locator("[data-silent-warning]")
    expect(warning).to_contain_text("Runner silent for 2 min — the machine may be gone", timeout=10_000)
    expect(admin.locator("[data-log-state]")).to_contain_text("The runner is silent", timeout=10_000)
    # The gate (GANTRY_RUNNER_FORCE_GATE, 300 s) is not reached yet: it says when it will be.
    expect(warning.locator("[data-force-wait]")).to_contain_text(re.compile(r"Force-delete possible in [34] min"))
    expect(warning.locator("[data-force-wait] time[datetime]")).to_have_count(1)
    expect(admin.locator("button[data-action=force-delete-runner]")).to_have_count(0)
    shot(admin, "run-silent")

    # A member sees the same warning, and no force-delete at all; the view refuses one anyway.
    member = open_as(browsers, "bob", f"/runs/{run.id}")
    expect(member.locator("[data-silent-warning]")).to_contain_text("the machine may be gone")
    expect(member.locator("[data-force-wait]")).to_have_count(0)
    expect(member.locator("button[data-action=force-delete-runner]")).to_have_count(0)
    bob = Client()
    bob.force_login(people["bob"])
    assert bob.post(f"/runs/{run.id}/force-delete-runner").status_code == 403
    assert Runner.objects.filter(id=claim["runner_id"]).exists()

    # Past the gate the button is there (the page refreshes itself); pressing it asks first, then deletes.
    silent_since(claim["runner_id"], 301)
    button = admin.locator("button[data-action=force-delete-runner]")
    expect(button).to_be_visible(timeout=10_000)
    expect(button).to_have_attribute("data-confirm", re.compile("Force-delete runner"))
    button.click()
    expect(admin.locator(".messages")).to_contain_text("force-deleted")
    expect(admin.locator("[data-run-status]")).to_have_text("failure")
    assert not Runner.objects.filter(id=claim["runner_id"]).exists()
    assert Run.objects.get(id=run.id).status == "failure"
    expect(admin.locator("[data-silent-warning]")).to_have_count(0)
    expect(admin.locator(".timeline")).to_contain_text("force_deleted")


def test_a_running_runs_log_follows_live_with_times_and_a_line_that_grows(
    browsers: Browsers, people: dict[str, User], stack: Stack, group: RunnerGroup
) -> None:
    run = deploy(stack)
    _, runner = start(group)

    def push(text: str, times: list[list[int]]) -> None:
        data = base64.b64encode(gzip.compress(text.encode())).decode()
        body = {"chunk_index": 0, "sealed_chunks": 0, "data": data, "times": times}
        assert runner.post(f"/api/v1/runs/{run.id}/logs/live", body, format="json").status_code == 204

    push("==> [1/1] build\ndownloading 10", [[0, T0]])
    page = open_as(browsers, "bob", f"/runs/{run.id}")
    step = page.locator("pre.log details.step")
    expect(step).to_have_attribute("open", "")
    expect(step.locator("summary")).to_have_attribute("data-badge", "running")
    expect(page.locator("#L2 .tx")).to_have_text("downloading 10")  # shown before its newline arrives
    push("==> [1/1] build\ndownloading 10\x1b[1m0%\x1b[0m done\nnext\n", [[0, T0], [30, T0 + 5000]])
    expect(page.locator("#L2 .tx")).to_have_text("downloading 100% done\n", timeout=10_000)  # the same line, grown
    expect(page.locator("#L2 .tx .a-b")).to_have_text("0%")
    expect(page.locator("#L3 .tx")).to_have_text("next\n")
    expect(page.locator("pre.log .line")).to_have_count(3)
    assert page.locator("#L3 .ts").get_attribute("data-ts") != page.locator("#L1 .ts").get_attribute("data-ts")
    expect(page.locator("[data-log-state]")).to_have_text("Following the log live…")
    # The times column can be hidden.
    page.locator("[data-log-times]").uncheck()
    expect(page.locator("#L1 .ts")).to_be_hidden()


def test_a_log_past_the_viewers_line_limit_goes_on_as_plain_text(
    browsers: Browsers, people: dict[str, User], stack: Stack, group: RunnerGroup
) -> None:
    run = deploy(stack)
    _, runner = start(group)
    text = "".join(f"\x1b[32mline {i}\x1b[0m\n" for i in range(1, 31))
    data = base64.b64encode(gzip.compress(text.encode())).decode()
    body = {"chunk_index": 0, "sealed_chunks": 0, "data": data}
    assert runner.post(f"/api/v1/runs/{run.id}/logs/live", body, format="json").status_code == 204
    page = browsers.open("bob")
    page.add_init_script("window.GANTRY_LOG_LINE_LIMIT = 20")  # the page's own limit is 50,000
    login(page, "bob", "bob-password-1")
    page.goto(f"/runs/{run.id}")
    expect(page.locator("pre.log .viewer-note")).to_have_attribute("data-plain-from", "21")
    expect(page.locator("pre.log .line")).to_have_count(20)
    expect(page.locator("pre.log")).to_contain_text("line 20\n[viewer: the log goes on past 20 lines")
    expect(page.locator("pre.log")).to_contain_text("(Download raw for the file)]\nline 21\n")
    assert (page.locator("pre.log").text_content() or "").endswith("line 30\n")
    assert "\x1b" not in (page.locator("pre.log").text_content() or "")


def test_a_queued_run_shows_its_reason_not_a_log_box_and_links_the_run_it_waits_for(
    browsers: Browsers, people: dict[str, User], stack: Stack, group: RunnerGroup
) -> None:
    first = deploy(stack)
    _, first_runner = start(group)  # the first run holds the stack's lane
    second = deploy(stack)
    page = open_as(browsers, "bob", f"/runs/{second.id}")
    expect(page.locator("[data-run-status]")).to_have_text("queued")
    reason = page.locator("[data-reason]")
    expect(reason).to_contain_text("waiting_for_lane")
    expect(reason.locator("a")).to_have_attribute("href", f"/runs/{first.id}")
    expect(page.locator("[data-wait]")).to_contain_text(re.compile(r"waiting for \d+ s"))
    expect(page.locator("pre.log")).to_have_count(0)
    expect(page.locator("[data-log-none]")).to_contain_text("No log yet")
    expect(page.get_by_text("Following the log live")).to_have_count(0)
    shot(page, "run-queued")

    # The lane frees and a runner starts it: the page comes back with the log viewer, by itself.
    done = {"outcome": "succeeded", "exit_code": 0}
    assert first_runner.post(f"/api/v1/runs/{first.id}/done", done, format="json").status_code == 204
    start(group)
    expect(page.locator("pre.log")).to_have_count(1, timeout=10_000)
    expect(page.locator("[data-run-status]")).to_have_text("running")
    expect(page.locator("[data-reason]")).to_have_count(0)


LOG = (
    "==> [1/2] build\n"
    "\x1b[32mcompiling\x1b[0m module\n"
    "\x1b[1;31merror:\x1b[0m not really \x1b]0;a title\x07\x1b[2K\n"
    "\x1b[38;5;208morange\x1b[0m \x1b[48;2;10;20;30mdeep\x1b[0m\n"
    "50%\r100%\n"
    "==> [1/2] build: exit code 0 (1.5s)\n"
    "==> [2/2] test\n" + "".join(f"test line {i}\n" for i in range(1, 41)) + "==> [2/2] test: exit code 3 (12.0s)\n"
)


def finish_with_log(run: Run, claim: dict[str, Any], runner: APIClient) -> None:
    """The runner seals the whole log as chunk 0 (with its line times) and reports the run failed."""
    data = gzip.compress(LOG.encode(), mtime=0)
    digest = hashlib.sha256(data).hexdigest()
    times = [[0, T0], [len("==> [1/2] build\n"), T0 + 1500], [LOG.index("==> [2/2] test\n"), T0 + 61_000]]
    body = {"sha256": digest, "size": len(data), "times": times}
    put = runner.post(f"/api/v1/runs/{run.id}/logs/chunks/0", body, format="json").json()
    assert APIClient().generic("PUT", put["url"], data, content_type="application/gzip").status_code == 201
    done = {"outcome": "failure", "exit_code": 3, "sealed_chunks": 1, "manifest": {"count": 1, "sha256": [digest]}}
    assert runner.post(f"/api/v1/runs/{run.id}/done", done, format="json").status_code == 204


def test_a_finished_runs_log_has_steps_colours_times_line_anchors_and_a_raw_download(
    browsers: Browsers, people: dict[str, User], stack: Stack, group: RunnerGroup
) -> None:
    run = deploy(stack)
    claim, runner = start(group)
    finish_with_log(run, claim, runner)

    page = open_as(browsers, "bob", f"/runs/{run.id}")
    expect(page.locator("[data-log-state]")).to_have_text("End of log.")
    expect(page.locator("[data-exit-code]")).to_have_text("3")
    steps = page.locator("pre.log details.step")
    expect(steps).to_have_count(2)
    expect(steps.nth(0)).to_have_attribute("data-exit", "0")
    expect(steps.nth(0)).to_have_attribute("data-duration", "1.5")
    expect(steps.nth(1)).to_have_attribute("data-exit", "3")
    expect(steps.nth(1).locator("summary")).to_have_attribute("data-badge", "exit 3 · 12.0 s")
    expect(steps.nth(1)).to_have_class(re.compile(r"\bbad\b"))
    # Colours as spans; the title escape and the erase-line are gone, not shown.
    expect(page.locator("pre.log span.a-fg32")).to_have_text("compiling")
    expect(page.locator("pre.log span.a-b.a-fg31")).to_have_text("error:")
    assert "\x1b" not in (page.locator("pre.log").text_content() or "")
    expect(page.locator("#L3 .tx")).to_have_text("error: not really \n")
    # 256 colours and RGB as inline colours; a carriage return shows what was written after it (a progress bar).
    orange = page.locator("#L4 .tx span").nth(0)
    expect(orange).to_have_text("orange")
    expect(orange).to_have_css("color", "rgb(255, 135, 0)")
    expect(page.locator("#L4 .tx span").nth(1)).to_have_css("background-color", "rgb(10, 20, 30)")
    expect(page.locator("#L5 .tx")).to_have_text("100%\n")
    # Line times: the mark at or before each line's first byte, shown beside it.
    local = page.evaluate(
        "ms => ms.map(m => { const d = new Date(m);"
        " return [d.getHours(), d.getMinutes(), d.getSeconds()].map(x => String(x).padStart(2, '0')).join(':'); })",
        [T0, T0 + 1500, T0 + 61_000],
    )
    expect(page.locator("#L1 .ts")).to_have_attribute("data-ts", local[0])
    expect(page.locator("#L2 .ts")).to_have_attribute("data-ts", local[1])
    expect(page.locator("#L6 .ts")).to_have_attribute("data-ts", local[1])  # the last line of step 1
    expect(page.locator("#L7 .ts")).to_have_attribute("data-ts", local[2])  # step 2's header
    expect(page.locator("#L30 .ts")).to_have_attribute("data-ts", local[2])
    # A line number is a link that sets the hash and highlights the line.
    page.locator("#L3 a.no").click()
    expect(page).to_have_url(re.compile(r"#L3$"))
    expect(page.locator("#L3")).to_have_class(re.compile(r"\bhl\b"))
    shot(page, "run-log")
    page.locator("#L12 a.no").click()
    expect(page.locator("#L12")).to_have_class(re.compile(r"\bhl\b"))
    expect(page.locator("#L3")).not_to_have_class(re.compile(r"\bhl\b"))
    # A step collapses (and its lines with it).
    steps.nth(0).locator("summary").click()
    expect(steps.nth(0)).not_to_have_attribute("open", "")
    expect(page.locator("#L3")).to_be_hidden()

    # Opening a URL with #L2 scrolls there and opens its (collapsed) step.
    other = open_as(browsers, "ada", f"/runs/{run.id}#L2")
    expect(other.locator("#L2")).to_have_class(re.compile(r"\bhl\b"))
    expect(other.locator("#L2")).to_be_in_viewport()

    # Download raw: the log's bytes exactly, escapes and all, as an attachment.
    link = page.locator("a[data-log-download]")
    expect(link).to_have_text("Download raw")
    answer = page.request.get(str(link.get_attribute("href")))
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.headers["content-disposition"] == f'attachment; filename="run-{run.id}.log"'
    assert answer.body() == LOG.encode()

    # Retried: the new attempt's timeline links the run it retries, and the attempts link each other.
    services.deployment_retry(deployment_id=run.deployment_id, by=people["bob"])
    again = Run.objects.get(deployment_id=run.deployment_id, attempt=2)
    page.goto(f"/runs/{again.id}")
    expect(page.locator(f".timeline a[href='/runs/{run.id}']")).to_have_text(str(run.id))
    expect(page.locator(f".sub a[href='/runs/{run.id}']")).to_have_text("1")


def test_another_orgs_run_and_its_download_are_404(people: dict[str, User], globex: Organization) -> None:
    from tests.dispatch.helpers import make_stack

    run = deploy(make_stack(globex, "theirs"))
    ada = Client()
    ada.force_login(people["ada"])
    assert ada.get(f"/runs/{run.id}").status_code == 404
    assert ada.get(f"/runs/{run.id}/log/raw").status_code == 404
    assert ada.post(f"/runs/{run.id}/force-delete-runner").status_code == 404
