"""Org scoping: an org admin sees and edits only the orgs where it holds the admin role."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus, Stack
from tests.admin.helpers import messages_of, url

# Django's "… doesn\u2019t exist. Perhaps it was deleted?" message.
DOES_NOT_EXIST = "doesn\u2019t exist"
GANTRY_MODELS = ["organization", "runnergroup", "runner", "stack", "deployment", "run"]


def test_it_lists_only_own_org_groups(owner_admin: Client, group: RunnerGroup, globex_group: RunnerGroup) -> None:
    r = owner_admin.get(url("runnergroup"))
    assert r.status_code == 200
    assert list(r.context["cl"].result_list) == [group]


def test_it_lists_only_own_org_stacks(owner_admin: Client, stack: Stack, globex_stack: Stack) -> None:
    r = owner_admin.get(url("stack"))
    assert r.status_code == 200
    assert list(r.context["cl"].result_list) == [stack]


def test_it_lists_only_own_org_runs_and_deployments(owner_admin: Client, run: Run, globex_run: Run) -> None:
    r = owner_admin.get(url("run"))
    assert list(r.context["cl"].result_list) == [run]
    r = owner_admin.get(url("deployment"))
    assert list(r.context["cl"].result_list) == [run.deployment]


def test_it_lists_only_own_orgs(owner_admin: Client, acme: Organization, globex: Organization) -> None:
    r = owner_admin.get(url("organization"))
    assert list(r.context["cl"].result_list) == [acme]


def test_it_does_not_offer_other_orgs_in_filters(owner_admin: Client, run: Run, globex_run: Run) -> None:
    r = owner_admin.get(url("run"))
    assert b"acme" in r.content
    assert b"globex" not in r.content


def test_it_lets_a_superuser_see_every_org(root_admin: Client, run: Run, globex_run: Run) -> None:
    r = root_admin.get(url("run"))
    assert {x.id for x in r.context["cl"].result_list} == {run.id, globex_run.id}


@pytest.mark.parametrize(
    ("model", "fixture"),
    [
        ("organization", "globex"),
        ("runnergroup", "globex_group"),
        ("stack", "globex_stack"),
        ("run", "globex_run"),
    ],
)
def test_it_hides_other_orgs_objects_by_url(
    owner_admin: Client, model: str, fixture: str, request: pytest.FixtureRequest
) -> None:
    obj = request.getfixturevalue(fixture)
    r = owner_admin.get(url(model, "change", obj.pk), follow=True)
    # Django's answer for an object outside get_queryset: back to the index, never the form.
    assert r.redirect_chain == [("/admin/", 302)]
    assert "adminform" not in r.context
    assert any(DOES_NOT_EXIST in m for m in messages_of(r))


def test_it_hides_other_orgs_deployment_by_url(owner_admin: Client, globex_run: Run) -> None:
    r = owner_admin.get(url("deployment", "change", globex_run.deployment_id), follow=True)
    assert any(DOES_NOT_EXIST in m for m in messages_of(r))
    assert "globex" not in r.content.decode()


def test_it_refuses_changing_another_orgs_stack(outsider_admin: Client, stack: Stack) -> None:
    r = outsider_admin.post(
        url("stack", "change", stack.pk),
        {"name": "hijacked", "labels": "{}", "spec": json.dumps(stack.spec), "secrets_update": '{"X": "y"}'},
    )
    assert r.status_code == 302
    stack.refresh_from_db()
    assert stack.name == "web"
    assert stack.secrets == {}


def test_it_refuses_changing_another_orgs_group(outsider_admin: Client, group: RunnerGroup) -> None:
    r = outsider_admin.post(
        url("runnergroup", "change", group.pk),
        {"name": "hijacked", "kind": "self_hosted", "labels": "{}", "max_concurrent_runs": "99"},
    )
    assert r.status_code == 302
    group.refresh_from_db()
    assert (group.name, group.max_concurrent_runs) == ("linux", 10)


def test_it_ignores_actions_on_another_orgs_runs(outsider_admin: Client, run: Run) -> None:
    r = outsider_admin.post(url("run"), {"action": "cancel", "_selected_action": [str(run.id)], "index": "0"})
    assert r.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING


def test_it_refuses_creating_a_stack_in_another_org(owner_admin: Client, globex: Organization) -> None:
    r = owner_admin.post(url("stack", "add"), {"organization": globex.pk, "name": "sneaky", "labels": "{}"})
    assert r.status_code == 200  # the form again, with an error
    assert "organization" in r.context["adminform"].form.errors
    assert not Stack.objects.filter(name="sneaky").exists()


def test_it_offers_only_own_orgs_in_foreign_keys(owner_admin: Client, acme: Organization, globex: Organization) -> None:
    r = owner_admin.get(url("runnergroup", "add"))
    choices = r.context["adminform"].form.fields["organization"].queryset
    assert list(choices) == [acme]


@pytest.mark.parametrize("model", GANTRY_MODELS)
def test_it_forbids_a_staff_member_without_admin_role(staff_member: User, model: str) -> None:
    client = Client()
    client.force_login(staff_member)
    assert client.get(url(model)).status_code == 403


def test_it_shows_no_gantry_app_to_a_staff_member(staff_member: User) -> None:
    client = Client()
    client.force_login(staff_member)
    r = client.get("/admin/")
    assert r.status_code == 200
    assert all(app["app_label"] != "core" for app in r.context["app_list"])


def test_it_shows_the_gantry_app_to_an_org_admin(owner_admin: Client) -> None:
    r = owner_admin.get("/admin/")
    core = [app for app in r.context["app_list"] if app["app_label"] == "core"]
    assert core
    assert {m["object_name"] for m in core[0]["models"]} == {
        "Organization",
        "RunnerGroup",
        "Runner",
        "Stack",
        "Deployment",
        "Run",
    }


@pytest.mark.parametrize("model", GANTRY_MODELS)
def test_it_sends_a_non_staff_member_to_login(teammate: User, model: str) -> None:
    client = Client()
    client.force_login(teammate)
    r = client.get(url(model))
    assert r.status_code == 302
    assert "/admin/login/" in r["Location"]


def test_it_forbids_a_demoted_admin(owner: User, owner_admin: Client, acme: Organization, stack: Stack) -> None:
    owner.memberships.filter(organization=acme).update(role="member")
    assert owner_admin.get(url("stack")).status_code == 403
    assert owner_admin.get(url("stack", "change", stack.pk)).status_code == 403


def test_it_renders_every_page_for_an_org_admin(
    owner_admin: Client, acme: Organization, group: RunnerGroup, run: Run
) -> None:
    runner = Runner.objects.create(runner_group=group)
    pages = {
        "organization": acme.pk,
        "runnergroup": group.pk,
        "runner": runner.pk,
        "stack": run.stack_id,
        "deployment": run.deployment_id,
        "run": run.pk,
    }
    for model, pk in pages.items():
        listing = owner_admin.get(url(model), {"q": "acme"})
        assert listing.status_code == 200, model
        assert listing.context["cl"].result_count >= 1, model
        assert owner_admin.get(url(model, "change", pk)).status_code == 200, model
    # The deployment page lists its runs, each linking to the run.
    assert (
        url("run", "change", run.pk) in owner_admin.get(url("deployment", "change", run.deployment_id)).content.decode()
    )
