"""The page frame (issue 24, deliverable 7): nav on every page, styled error pages, a favicon, the landing org."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client, override_settings
from django.urls import include, path

from gantry.core import services
from gantry.core.models import Membership, Organization, Role, Run, Stack
from gantry.web import errors
from tests.dispatch.helpers import deploy


def session(user: User) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def nav_links(html: str, slug: str) -> bool:
    return f'href="/orgs/{slug}/queue"' in html and f'href="/orgs/{slug}/runner-groups"' in html


def test_it_lands_a_super_admin_on_an_org_they_belong_to(acme: Organization, root: User) -> None:
    # "aardvark" sorts first of all orgs; root is a member of acme only.
    Organization.objects.create(slug="aardvark", name="Aardvark")
    Membership.objects.create(user=root, organization=acme, role=Role.ADMIN)
    response = session(root).get("/")
    assert response.status_code == 302
    assert response["Location"] == "/orgs/acme/queue"


def test_it_lands_a_super_admin_of_no_org_on_the_first_org(acme: Organization, root: User) -> None:
    Organization.objects.create(slug="zebra", name="Zebra")
    assert session(root).get("/")["Location"] == "/orgs/acme/queue"


def test_the_invitations_page_keeps_the_org_links(teammate: User, globex: Organization, owner: User) -> None:
    services.membership_set(org=globex, username=teammate.username, role=Role.MEMBER, by=owner)
    html = session(teammate).get("/invitations").content.decode()
    assert nav_links(html, "acme")
    assert "UTC</time>" in html  # the invitation's time, as a <time> element


def test_another_orgs_page_is_a_styled_404_with_the_nav(teammate: User, globex: Organization) -> None:
    response = session(teammate).get("/orgs/globex/queue")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'data-error-page="404"' in html
    assert "gantry.css" in html
    assert nav_links(html, "acme")
    assert "globex" not in html.replace("/orgs/globex/queue", "")  # only the path it was asked for


def test_an_unknown_path_is_a_styled_404_for_anyone(db: None) -> None:
    response = Client().get("/no/such/page")
    assert response.status_code == 404
    assert 'data-error-page="404"' in response.content.decode()


def test_an_api_path_still_answers_json(teammate: User) -> None:
    response = session(teammate).get("/api/v1/no-such-route")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_non_super_admin_setting_the_rate_gets_a_styled_403(owner: User) -> None:
    response = session(owner).post("/orgs/acme/rate", {"runs_per_hour_limit": "5"})
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-error-page="403"' in html
    assert "Only a super-admin sets the dispatch rate" in html
    assert nav_links(html, "acme")


def _boom(request: Any) -> Any:
    raise RuntimeError("a page crashed")


# The site's own routes (the error page reverses them) plus one that crashes.
urlpatterns = [path("boom", _boom), path("", include("gantry.urls"))]
handler500 = "gantry.web.errors.server_error"


@override_settings(ROOT_URLCONF=__name__)
def test_the_500_page_is_styled_and_needs_neither_the_database_nor_a_user(teammate: User) -> None:
    client = session(teammate)
    response = client.get("/boom")
    assert response.status_code == 500
    assert 'data-error-page="500"' in response.content.decode()


def test_the_500_page_renders_with_the_database_closed(rf: Any, db: None) -> None:
    request = rf.get("/queue")  # no user, no session: as Django calls handler500 when all else failed
    blocked = connections["default"].execute_wrapper(_no_queries)
    with blocked:
        response = errors.server_error(request)
    assert response.status_code == 500
    html = response.content.decode()
    assert 'data-error-page="500"' in html
    assert "gantry.css" in html


def _no_queries(*args: Any) -> Any:
    raise AssertionError("the 500 page queried the database")


@pytest.mark.parametrize("who", ["anonymous", "member"])
def test_the_favicon_answers_on_every_path(teammate: User, who: str) -> None:
    client = session(teammate) if who == "member" else Client()
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("web/favicon.svg")
    icon = client.get(response["Location"])
    assert icon.status_code == 200
    assert b"<svg" in (b"".join(icon.streaming_content) if icon.streaming else icon.content)
    assert 'rel="icon"' in client.get("/orgs/acme/queue" if who == "member" else "/login").content.decode()


def test_a_form_whose_csrf_token_fails_gets_the_styled_403_and_changes_nothing(owner: User, acme: Organization) -> None:
    group, _token = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(f"/runner-groups/{group.id}/drain")  # no csrfmiddlewaretoken: a stale or forged form
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-error-page="403"' in html
    assert "The form expired" in html
    assert 'href="/orgs/acme/queue"' in html  # the nav: a step back, not a dead end
    group.refresh_from_db()
    assert not group.drained


@pytest.mark.parametrize(
    "path", ["/orgs/acme/members/invite", "/orgs/acme/webhooks/add", "/orgs/acme/runner-groups/new"]
)
def test_every_admin_form_refuses_a_member_with_the_styled_403(teammate: User, acme: Organization, path: str) -> None:
    response = session(teammate).post(path, {"who": "eve@example.com", "role": "member", "name": "g"})
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-error-page="403"' in html
    assert "This needs the org admin role" in html


def test_a_member_pressing_an_admins_button_gets_the_styled_403(teammate: User, acme: Organization) -> None:
    group, _token = services.runner_group_create(org=acme, name="linux", labels={"os": "linux"})
    response = session(teammate).post(f"/runner-groups/{group.id}/drain")
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-error-page="403"' in html
    assert "This needs the org admin role" in html
    group.refresh_from_db()
    assert not group.drained


def test_the_lane_holder_and_retry_of_ids_link_to_their_runs(teammate: User, stack: Stack) -> None:
    first = deploy(stack)
    second = deploy(stack)  # queued behind the first, which holds the stack's lane
    client = session(teammate)
    queue_html = client.get("/orgs/acme/queue").content.decode()
    assert f'<a href="/runs/{first.id}" data-lane-holder>{first.id}</a>' in queue_html
    run_html = client.get(f"/runs/{second.id}").content.decode()
    assert f'<a href="/runs/{first.id}" data-lane-holder>' in run_html

    services.run_request_cancellation(run_id=first.id)  # cancelled: retryable
    services.deployment_retry(deployment_id=first.deployment_id)
    retry = Run.objects.filter(deployment_id=first.deployment_id).order_by("-attempt").first()
    assert retry is not None
    assert retry.id != first.id
    retry_html = client.get(f"/runs/{retry.id}").content.decode()
    assert f'retry_of=<a href="/runs/{first.id}" data-run-link>' in retry_html


def test_a_page_says_how_cancel_and_skip_differ(teammate: User, stack: Stack) -> None:
    run = deploy(stack)
    client = session(teammate)
    run_html = client.get(f"/runs/{run.id}").content.decode()
    assert "data-cancel-vs-skip" in run_html
    assert 'data-confirm="Cancel this run?' in run_html
    assert 'data-confirm="Skip this deployment?' in run_html
    assert "lane moves on" in client.get("/orgs/acme/queue").content.decode()
