"""The runner-group pages without a browser (gantry.web.group_pages): scoping, refusals, what each shows.

The browser tests (tests/browser/test_groups.py) press the buttons; these
check the answers a crafted request gets, and the page's facts.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from gantry import conf
from gantry import redis as gantry_redis
from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch import coordinators
from gantry.dispatch.claim import claim
from gantry.web.group_pages import NEW_TOKEN_KEY, coordinator_commands, create_fields
from tests.dispatch.helpers import deploy, make_stack

pytestmark = pytest.mark.django_db


def _as(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def linux(acme: Organization) -> RunnerGroup:
    group, _ = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"}, max_concurrent_runs=3)
    gantry_redis.client().delete(coordinators.key_for(group.id))  # group ids repeat from test to test
    return group


def test_the_group_page_shows_its_runners_and_coordinators(
    acme: Organization, teammate: User, linux: RunnerGroup
) -> None:
    run = deploy(make_stack(acme, "app", {"os": "linux"}))
    assert claim(group=linux) is not None
    coordinators.forget_writes()
    coordinators.record(group_id=linux.id, who=coordinators.Identity(id="c1", host="build-1", version="0.1.0"))

    page = _as(teammate).get(f"/runner-groups/{linux.id}")

    assert page.status_code == 200
    html = page.content.decode()
    assert "1 of 3 slots in use" in html
    assert f'href="/runs/{run.id}"' in html
    assert 'data-coordinator="c1"' in html
    assert "build-1" in html
    assert "0.1.0" in html
    assert "data-action=" not in html  # a member gets no admin button


def test_another_orgs_group_is_a_404_and_a_members_post_a_403(
    acme: Organization, teammate: User, outsider: User, linux: RunnerGroup
) -> None:
    assert _as(outsider).get(f"/runner-groups/{linux.id}").status_code == 404
    assert _as(outsider).post(f"/runner-groups/{linux.id}/archive").status_code == 404
    assert _as(teammate).post(f"/runner-groups/{linux.id}/archive").status_code == 403
    assert _as(teammate).post("/orgs/acme/runner-groups/new", {"name": "x"}).status_code == 403
    runner = Runner.objects.create(runner_group=linux)
    forced = _as(teammate).post(f"/runner-groups/{linux.id}/runners/{runner.id}/force-delete")
    assert forced.status_code == 403
    assert RunnerGroup.objects.get(id=linux.id).archived_at is None
    assert Runner.objects.filter(id=runner.id).exists()
    assert not RunnerGroup.objects.filter(name="x").exists()


def test_creating_a_group_shows_its_token_once_with_the_commands(acme: Organization, owner: User) -> None:
    admin = _as(owner)
    answer = admin.post(
        "/orgs/acme/runner-groups/new",
        {"name": "arm", "kind": "self_hosted", "labels": "os=linux, arch=arm64", "max_concurrent_runs": "4"},
    )
    group = RunnerGroup.objects.get(organization=acme, name="arm")
    assert answer.status_code == 302
    assert answer["Location"] == f"/runner-groups/{group.id}"
    assert group.labels == {"os": "linux", "arch": "arm64"}
    assert group.max_concurrent_runs == 4

    first = admin.get(answer["Location"]).content.decode()
    assert "data-new-token" in first
    for launcher in ("local", "docker", "kubernetes"):
        assert f'data-launcher="{launcher}"' in first
    assert "--server http://testserver" in first
    second = admin.get(answer["Location"]).content.decode()
    assert "data-new-token" not in second  # shown once
    assert NEW_TOKEN_KEY not in admin.session


def test_the_commands_carry_a_working_token(acme: Organization, owner: User) -> None:
    group, token = services.runner_group_create(org=acme, name="a b", labels={})
    commands = coordinator_commands(server="https://g.example", group=group, token=token)
    assert [c["launcher"] for c in commands] == ["local", "docker", "kubernetes"]
    assert all(f"export GANTRY_GROUP_TOKEN={token}" in c["command"] for c in commands)
    assert "--state-dir /var/lib/gantry-coordinator/a-b" in commands[0]["command"]


@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"name": ""}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "g", "kind": "mainframe"}, "kind"),
        ({"name": "g", "max_concurrent_runs": "0"}, "slots"),
        ({"name": "g", "max_concurrent_runs": "\u00b2"}, "slots"),
        ({"name": "g", "max_concurrent_runs": "9" * 5000}, "slots"),
        ({"name": "g", "labels": "novalue"}, "labels"),
        ({"name": "g", "labels": "a=1, a=2"}, "labels"),
        ({"name": "g", "kind": "github_actions"}, "github"),
        ({"name": "linux"}, "exists"),
    ],
)
def test_a_bad_create_form_says_why_and_creates_nothing(
    acme: Organization, owner: User, linux: RunnerGroup, form: dict[str, str], says: str
) -> None:
    before = RunnerGroup.objects.count()
    admin = _as(owner)

    answer = admin.post("/orgs/acme/runner-groups/new", form, follow=True)

    assert answer.status_code == 200
    messages = [str(m) for m in answer.context["messages"]]
    assert any(says in m for m in messages), messages
    assert RunnerGroup.objects.count() == before


def test_create_fields_match_what_the_service_takes() -> None:
    assert create_fields({"name": " g ", "labels": "k=v\nx = y"}) == {
        "name": "g",
        "kind": "self_hosted",
        "labels": {"k": "v", "x": "y"},
        "max_concurrent_runs": 10,
    }


def test_archive_from_the_page_refuses_a_busy_group_and_archives_an_idle_one(
    acme: Organization, owner: User, linux: RunnerGroup
) -> None:
    deploy(make_stack(acme, "app", {"os": "linux"}))
    won = claim(group=linux)
    assert won is not None
    admin = _as(owner)

    busy = admin.post(f"/runner-groups/{linux.id}/archive", follow=True)
    assert any("holds run" in str(m) for m in busy.context["messages"])
    assert RunnerGroup.objects.get(id=linux.id).archived_at is None

    Run.objects.filter(id=won.run_id).update(status=RunStatus.SUCCEEDED)
    done = admin.post(f"/runner-groups/{linux.id}/archive")
    assert done.status_code == 302
    assert done["Location"] == "/orgs/acme/runner-groups"
    assert RunnerGroup.objects.get(id=linux.id).archived_at is not None
    listed = admin.get("/orgs/acme/runner-groups").content.decode()
    assert f'data-group="{linux.id}"' not in listed
    # Its page stays readable, with no buttons.
    page = admin.get(f"/runner-groups/{linux.id}").content.decode()
    assert "Archived" in page
    assert "data-action=" not in page


def test_force_delete_waits_for_the_gate_then_deletes(acme: Organization, owner: User, linux: RunnerGroup) -> None:
    runner = Runner.objects.create(runner_group=linux, last_seen_at=timezone.now())
    admin = _as(owner)
    page = admin.get(f"/runner-groups/{linux.id}").content.decode()
    assert "force-delete from" in page
    assert 'data-action="force-delete"' not in page

    refused = admin.post(f"/runner-groups/{linux.id}/runners/{runner.id}/force-delete", follow=True)
    assert any("offline" in str(m) for m in refused.context["messages"])
    assert Runner.objects.filter(id=runner.id).exists()

    gone = timezone.now() - timedelta(seconds=conf.get().runner_force_gate + 1)
    Runner.objects.filter(id=runner.id).update(last_seen_at=gone)
    assert 'data-action="force-delete"' in admin.get(f"/runner-groups/{linux.id}").content.decode()
    assert admin.post(f"/runner-groups/{linux.id}/runners/{runner.id}/force-delete").status_code == 302
    assert not Runner.objects.filter(id=runner.id).exists()


def test_the_groups_list_links_each_group_and_counts_slots_and_coordinators(
    acme: Organization, teammate: User, linux: RunnerGroup
) -> None:
    coordinators.forget_writes()
    coordinators.record(group_id=linux.id, who=coordinators.Identity(id="c1", host="h1", version="1"))
    coordinators.record(
        group_id=linux.id,
        who=coordinators.Identity(id="c2", host="h2", version="1"),
        now=timezone.now().timestamp() - 3600,
    )

    html = _as(teammate).get("/orgs/acme/runner-groups").content.decode()

    assert f'href="/runner-groups/{linux.id}"' in html
    assert "0 / 3" in html
    assert "1 online" in html
    assert "1 silent" in html


def test_a_poll_without_identity_is_mentioned_as_an_unidentified_coordinator(
    acme: Organization, teammate: User, linux: RunnerGroup
) -> None:
    from rest_framework.test import APIClient

    from gantry.core import tokens

    old = APIClient()  # an older coordinator: no identity headers
    old.credentials(HTTP_AUTHORIZATION="Bearer " + tokens.mint_group_token(group_id=linux.id, token_version=1))
    assert old.get("/api/v1/runner-groups/poll").status_code == 204

    html = _as(teammate).get(f"/runner-groups/{linux.id}").content.decode()

    assert "data-unidentified" in html
    assert "does not name itself" in html
