"""The stack pages (gantry.web.stack_pages): the stacks list, a stack and its history, deploy, run again, archive."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gantry.core import services
from gantry.core.models import Deployment, Organization, Run, RunStatus, Stack
from tests.conftest import SPEC
from tests.dispatch.helpers import deploy

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_buckets")]

OTHER_SPEC = {"steps": [{"name": "other", "run": "echo other"}], "env": {}, "timeout_seconds": 30}


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def finished(stack: Stack, *, by: User | None = None, spec: dict | None = None) -> Run:
    """A terminal run of ``stack`` (cancelled before it started: no runner needed)."""
    deployment = services.deployment_create(stack=stack, spec=spec, created_by=by)
    run = Run.objects.get(deployment=deployment)
    return services.run_request_cancellation(run_id=run.id)


def messages_of(response: object) -> list[str]:
    return [str(m) for m in response.context["messages"]]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the stacks list


def test_it_lists_the_orgs_live_stacks_with_their_last_run(
    owner: User, teammate: User, acme: Organization, stack: Stack, globex_stack: Stack
) -> None:
    deploy(stack)
    newest = deploy(stack)
    idle = services.stack_create(org=acme, name="idle", spec=SPEC)
    gone = services.stack_create(org=acme, name="gone", spec=SPEC)
    services.stack_archive(stack_id=gone.id)

    page = browser(teammate).get("/orgs/acme/stacks")

    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-last-run="{newest.id}"' in html
    assert f'data-stack="{idle.id}"' in html
    assert "never deployed" in html
    assert f'data-stack="{gone.id}"' not in html  # archived: left out
    assert f'data-stack="{globex_stack.id}"' not in html
    assert html.count('data-action="deploy"') == 2  # a member deploys too
    assert f'<time datetime="{newest.created_at.isoformat()}' in html
    assert "2 stacks." in html


def test_another_orgs_stack_pages_are_404(outsider: User, stack: Stack) -> None:
    client = browser(outsider)
    assert client.get("/orgs/acme/stacks").status_code == 404
    assert client.get(f"/stacks/{stack.id}").status_code == 404
    assert client.post(f"/stacks/{stack.id}/deploy").status_code == 404
    assert client.post(f"/stacks/{stack.id}/archive").status_code == 404
    assert not Deployment.objects.filter(stack=stack).exists()


def test_the_stacks_list_reads_in_a_fixed_number_of_statements(owner: User, acme: Organization) -> None:
    def count(n: int) -> int:
        for i in range(n - Stack.objects.filter(organization=acme).count()):
            deploy(services.stack_create(org=acme, name=f"s{n}-{i}", spec=SPEC))
        with CaptureQueriesContext(connection) as q:
            assert client.get("/orgs/acme/stacks").status_code == 200
        return len(q)

    client = browser(owner)
    assert count(5) == count(50)


# ---------------------------------------------------------------- one stack


def test_it_shows_the_stacks_facts_and_secret_names_never_values(teammate: User, acme: Organization) -> None:
    stack = services.stack_create(
        org=acme,
        name="api",
        labels={"gantry:runner-group:os": "linux", "team": "core"},
        spec=SPEC,
        secrets={"DEPLOY_KEY": "s3cr3t-value-xyz"},
    )
    html = browser(teammate).get(f"/stacks/{stack.id}").content.decode()
    assert "DEPLOY_KEY" in html
    assert "s3cr3t-value-xyz" not in html
    assert stack.secrets["DEPLOY_KEY"] not in html  # nor its ciphertext
    assert "os=linux" in html
    assert "team=core" in html
    assert "1 step: <code>hello</code>" in html
    assert 'data-action="archive"' not in html
    assert "spec_from_run" not in html


def test_the_history_shows_who_queued_each_run_and_its_durations(owner: User, teammate: User, stack: Stack) -> None:
    t0 = timezone.now() - timedelta(hours=1)
    deployment = services.deployment_create(stack=stack, created_by=teammate, now=t0)
    run = Run.objects.get(deployment=deployment)
    # The times a runner would have set (started 90 s after queueing, ran 7 min).
    Run.objects.filter(id=run.id).update(
        status=RunStatus.SUCCEEDED, started_at=t0 + timedelta(seconds=90), finished_at=t0 + timedelta(seconds=510)
    )
    html = browser(owner).get(f"/stacks/{stack.id}").content.decode()
    row = re.search(rf'<tr data-run="{run.id}".*?</tr>', html, re.S)
    assert row is not None
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", row.group(0), re.S)]
    assert cells[1:4] == ["1", "succeeded", "teammate"]
    assert cells[5:] == ["90 s", "7 min", "8 min"]


def test_the_history_filters_by_status_and_by_who_queued(owner: User, teammate: User, stack: Stack) -> None:
    mine = finished(stack, by=owner)
    theirs = finished(stack, by=teammate)
    waiting = services.deployment_create(stack=stack, created_by=teammate)
    waiting_run = Run.objects.get(deployment=waiting)
    client = browser(teammate)

    html = client.get(f"/stacks/{stack.id}", {"status": "cancelled"}).content.decode()
    assert str(mine.id) in html
    assert str(theirs.id) in html
    assert str(waiting_run.id) not in html
    html = client.get(f"/stacks/{stack.id}", {"status": "cancelled", "by": "teammate"}).content.decode()
    assert str(theirs.id) in html
    assert str(mine.id) not in html
    assert '<option value="teammate" selected>' in html
    html = client.get(f"/stacks/{stack.id}", {"status": "failure"}).content.decode()
    assert "No run matches these filters." in html


def test_the_history_pages_twenty_at_a_time_keeping_its_filters(owner: User, stack: Stack) -> None:
    t0 = timezone.now() - timedelta(hours=2)
    runs = [finished_at(stack, t0 + timedelta(seconds=i)) for i in range(45)]
    client = browser(owner)
    seen: list[str] = []
    url = f"/stacks/{stack.id}?status=cancelled"
    for _ in range(3):
        html = client.get(url).content.decode()
        seen += re.findall(r'<tr data-run="([0-9a-f-]+)"', html)
        older = re.search(r'href="(\?[^"]+)" rel="next"', html)
        if older is None:
            break
        assert "status=cancelled" in older.group(1)
        url = f"/stacks/{stack.id}" + older.group(1).replace("&amp;", "&")
    assert seen == [str(r.id) for r in reversed(runs)]  # newest first, each once, all 45


def finished_at(stack: Stack, at: object) -> Run:
    deployment = services.deployment_create(stack=stack, now=at)  # type: ignore[arg-type]
    run = Run.objects.get(deployment=deployment)
    return services.run_request_cancellation(run_id=run.id, now=at)  # type: ignore[arg-type]


# Cursors of the right shape whose time has a +23:59 offset: PostgreSQL refuses the offset, so the page converts
# the time to UTC first; the one of year 1 has no UTC time at all (before datetime.min).
OFFSET_CURSOR = "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzIzOjU5IiwgIjAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMCJd"
YEAR_1_CURSOR = "WyIwMDAxLTAxLTAxVDAwOjAwOjAwKzIzOjU5IiwgIjAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMCJd"


@pytest.mark.parametrize(
    "query",
    [{"status": "bogus"}, {"by": "x" * 151}, {"cursor": "not-a-cursor"}, {"cursor": YEAR_1_CURSOR}],
    ids=["status", "by", "cursor", "cursor-before-year-1"],
)
def test_a_bad_query_string_is_a_400_page_never_a_500(owner: User, stack: Stack, query: dict) -> None:
    finished(stack)
    response = browser(owner).get(f"/stacks/{stack.id}", query)
    assert response.status_code == 400
    html = response.content.decode()
    assert "data-error" in html
    assert "<tr data-run" not in html


def test_a_cursor_with_an_offset_postgresql_refuses_is_read_in_utc(owner: User, stack: Stack) -> None:
    old = finished_at(stack, timezone.now().replace(year=2025))
    finished(stack)
    response = browser(owner).get(f"/stacks/{stack.id}", {"cursor": OFFSET_CURSOR})
    assert response.status_code == 200
    assert re.findall(r'<tr data-run="([0-9a-f-]+)"', response.content.decode()) == [str(old.id)]


@pytest.mark.parametrize("admin", [True, False], ids=["admin", "member"])
def test_the_stack_page_reads_in_a_fixed_number_of_statements(
    owner: User, teammate: User, stack: Stack, admin: bool
) -> None:
    client = browser(owner if admin else teammate)

    def count(n: int) -> int:
        for _ in range(n - Run.objects.filter(stack=stack).count()):
            finished(stack, by=teammate)
        with CaptureQueriesContext(connection) as q:
            assert client.get(f"/stacks/{stack.id}").status_code == 200
        return len(q)

    assert count(5) == count(50)


# ---------------------------------------------------------------- deploy


def test_a_member_deploys_the_stacks_own_spec_and_lands_on_its_run(teammate: User, stack: Stack) -> None:
    response = browser(teammate).post(f"/stacks/{stack.id}/deploy", {"from": "stacks"}, follow=True)
    deployment = Deployment.objects.get(stack=stack)
    run = Run.objects.get(deployment=deployment)
    assert response.redirect_chain[-1][0] == f"/runs/{run.id}"
    assert deployment.created_by == teammate
    assert deployment.spec == stack.spec
    assert messages_of(response) == ["Deployed web: its run is pending."]


def test_a_refusal_comes_back_on_the_page_it_was_pressed_on(teammate: User, acme: Organization) -> None:
    bare = services.stack_create(org=acme, name="bare")  # no default spec
    response = browser(teammate).post(f"/stacks/{bare.id}/deploy", {"from": "stacks"}, follow=True)
    assert response.redirect_chain[-1][0] == "/orgs/acme/stacks"
    assert messages_of(response) == ["the stack has no default spec; pass one"]
    assert not Deployment.objects.filter(stack=bare).exists()


def test_an_admin_deploys_an_earlier_runs_spec_a_member_may_not(
    owner: User, teammate: User, stack: Stack, acme: Organization
) -> None:
    old = finished(stack, by=owner, spec=OTHER_SPEC)

    refused = browser(teammate).post(f"/stacks/{stack.id}/deploy", {"spec_from_run": str(old.id)})
    assert refused.status_code == 403
    assert Deployment.objects.filter(stack=stack).count() == 1

    html = browser(owner).get(f"/stacks/{stack.id}").content.decode()
    assert f'<option value="{old.id}">' in html
    response = browser(owner).post(f"/stacks/{stack.id}/deploy", {"spec_from_run": str(old.id)}, follow=True)
    newest = Deployment.objects.filter(stack=stack).order_by("-id").first()
    assert newest is not None
    assert newest.spec == OTHER_SPEC
    assert newest.created_by == owner
    assert response.redirect_chain[-1][0] == f"/runs/{Run.objects.get(deployment=newest).id}"

    # A run of another stack, or no run at all, deploys nothing.
    other = finished(services.stack_create(org=acme, name="other", spec=SPEC))
    for value in (str(other.id), "nonsense"):
        response = browser(owner).post(f"/stacks/{stack.id}/deploy", {"spec_from_run": value}, follow=True)
        assert response.redirect_chain[-1][0] == f"/stacks/{stack.id}"
        assert messages_of(response)
    assert Deployment.objects.filter(stack=stack).count() == 2


# ---------------------------------------------------------------- run again


def test_a_member_runs_again_a_finished_run_of_the_current_spec(teammate: User, stack: Stack) -> None:
    old = finished(stack, by=teammate)
    client = browser(teammate)
    assert 'data-action="run-again"' in client.get(f"/runs/{old.id}").content.decode()

    response = client.post(f"/runs/{old.id}/run-again", follow=True)

    newest = Deployment.objects.filter(stack=stack).order_by("-id").first()
    assert newest is not None
    assert newest.id != old.deployment_id
    run = Run.objects.get(deployment=newest)
    assert response.redirect_chain[-1][0] == f"/runs/{run.id}"
    assert newest.spec == stack.spec
    assert newest.created_by == teammate


def test_a_changed_spec_is_run_again_by_an_admin_only(owner: User, teammate: User, stack: Stack) -> None:
    old = finished(stack, by=owner, spec=OTHER_SPEC)
    member = browser(teammate)
    html = member.get(f"/runs/{old.id}").content.decode()
    assert 'data-action="run-again"' not in html
    assert "only an org admin may run this spec again" in html
    assert member.post(f"/runs/{old.id}/run-again").status_code == 403
    assert Deployment.objects.filter(stack=stack).count() == 1

    admin = browser(owner)
    assert 'data-action="run-again"' in admin.get(f"/runs/{old.id}").content.decode()
    admin.post(f"/runs/{old.id}/run-again")
    newest = Deployment.objects.filter(stack=stack).order_by("-id").first()
    assert newest is not None
    assert newest.spec == OTHER_SPEC


def test_only_a_finished_run_of_a_live_stack_runs_again(owner: User, stack: Stack) -> None:
    active = deploy(stack)
    client = browser(owner)
    assert 'data-action="run-again"' not in client.get(f"/runs/{active.id}").content.decode()
    response = client.post(f"/runs/{active.id}/run-again", follow=True)
    assert messages_of(response) == ["Only a finished run can be run again; this one is pending."]
    assert Deployment.objects.filter(stack=stack).count() == 1

    services.run_request_cancellation(run_id=active.id)
    services.stack_archive(stack_id=stack.id)
    html = client.get(f"/runs/{active.id}").content.decode()
    assert 'data-action="run-again"' not in html
    assert "The stack is archived" in html
    response = client.post(f"/runs/{active.id}/run-again", follow=True)
    assert messages_of(response) == ["the stack is archived: it takes no new deployment"]
    assert Deployment.objects.filter(stack=stack).count() == 1


# ---------------------------------------------------------------- archive


def test_an_admin_archives_a_stack_a_member_may_not(owner: User, teammate: User, stack: Stack) -> None:
    run = deploy(stack)
    assert browser(teammate).post(f"/stacks/{stack.id}/archive").status_code == 403
    assert Stack.objects.get(id=stack.id).archived_at is None

    html = browser(owner).get(f"/stacks/{stack.id}").content.decode()
    assert 'data-action="archive" data-confirm="Archive web?' in html
    response = browser(owner).post(f"/stacks/{stack.id}/archive", follow=True)
    assert response.redirect_chain[-1][0] == "/orgs/acme/stacks"
    assert Stack.objects.get(id=stack.id).archived_at is not None
    assert Run.objects.get(id=run.id).status == RunStatus.CANCELLED
    # Its page stays, read-only, with its history.
    html = browser(teammate).get(f"/stacks/{stack.id}").content.decode()
    assert "data-archived" in html
    assert str(run.id) in html
    assert 'data-action="deploy"' not in html


def test_archiving_a_busy_stack_says_why_on_its_page(owner: User, stack: Stack, group: object) -> None:
    from tests.queue.helpers import poll

    run = deploy(stack)
    assert poll(group) is not None  # claimed
    response = browser(owner).post(f"/stacks/{stack.id}/archive", follow=True)
    assert response.redirect_chain[-1][0] == f"/stacks/{stack.id}"
    said = f"run {run.id} of this stack is assigned: cancel it or let it finish, then archive"
    assert messages_of(response) == [said]
    assert Stack.objects.get(id=stack.id).archived_at is None
