"""Runner groups: tokens shown once, drain through services, labels validated."""

from __future__ import annotations

import re

from django.test import Client

from gantry.core import services, tokens
from gantry.core.models import Organization, RunnerGroup
from tests.admin.helpers import messages_of, url

JWT = re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]+")


def _token_in(messages: list[str]) -> str:
    found = [m for text in messages for m in JWT.findall(text)]
    assert len(found) == 1, messages
    return found[0]


def test_it_shows_a_new_groups_token_once(owner_admin: Client, acme: Organization) -> None:
    r = owner_admin.post(
        url("runnergroup", "add"),
        {
            "organization": acme.pk,
            "name": "arm",
            "kind": "self_hosted",
            "labels": '{"arch": "arm64"}',
            "max_concurrent_runs": "3",
        },
        follow=True,
    )
    assert r.status_code == 200
    group = RunnerGroup.objects.get(organization=acme, name="arm")
    assert (group.labels, group.max_concurrent_runs) == ({"arch": "arm64"}, 3)
    token = _token_in(messages_of(r))
    claims = tokens.decode(token)
    assert (claims.audience, claims.subject, claims.raw["ver"]) == (tokens.AUD_GROUP, str(group.pk), 1)
    again = owner_admin.get(url("runnergroup", "change", group.pk))
    assert token not in again.content.decode()


def test_it_rotates_the_token(owner_admin: Client, group: RunnerGroup) -> None:
    old = tokens.mint_group_token(group_id=group.pk, token_version=group.token_version)
    assert owner_admin.get(f"/api/v1/runner-groups/{group.pk}", HTTP_AUTHORIZATION=f"Bearer {old}").status_code != 401
    r = owner_admin.post(
        url("runnergroup"), {"action": "rotate_token", "_selected_action": [group.pk], "index": "0"}, follow=True
    )
    assert r.status_code == 200
    group.refresh_from_db()
    assert group.token_version == 2
    new = _token_in(messages_of(r))
    assert tokens.decode(new).raw["ver"] == 2
    # The old token now names a stale version: the API refuses it, the new one authenticates.
    assert owner_admin.get(f"/api/v1/runner-groups/{group.pk}", HTTP_AUTHORIZATION=f"Bearer {old}").status_code == 401
    assert owner_admin.get(f"/api/v1/runner-groups/{group.pk}", HTTP_AUTHORIZATION=f"Bearer {new}").status_code != 401
    # Shown once: the next page no longer carries it.
    assert new not in owner_admin.get(url("runnergroup")).content.decode()


def test_it_drains_and_undrains(owner_admin: Client, group: RunnerGroup) -> None:
    owner_admin.post(url("runnergroup"), {"action": "drain", "_selected_action": [group.pk], "index": "0"})
    group.refresh_from_db()
    assert group.drained
    owner_admin.post(url("runnergroup"), {"action": "undrain", "_selected_action": [group.pk], "index": "0"})
    group.refresh_from_db()
    assert not group.drained


def test_it_refuses_reserved_group_labels(owner_admin: Client, acme: Organization) -> None:
    r = owner_admin.post(
        url("runnergroup", "add"),
        {"organization": acme.pk, "name": "bad", "kind": "self_hosted", "labels": '{"gantry:x": "y"}',
         "max_concurrent_runs": "1"},
    )  # fmt: skip
    assert r.status_code == 200
    assert "reserved" in str(r.context["adminform"].form.errors["labels"])
    assert not RunnerGroup.objects.filter(name="bad").exists()


def test_it_edits_a_group_through_the_service(owner_admin: Client, group: RunnerGroup) -> None:
    r = owner_admin.post(
        url("runnergroup", "change", group.pk),
        {"name": "linux2", "kind": "self_hosted", "labels": '{"os": "linux"}', "max_concurrent_runs": "4"},
    )
    assert r.status_code == 302
    group.refresh_from_db()
    assert (group.name, group.labels, group.max_concurrent_runs, group.token_version) == (
        "linux2",
        {"os": "linux"},
        4,
        1,
    )


def test_it_refuses_a_duplicate_name_on_change(owner_admin: Client, acme: Organization, group: RunnerGroup) -> None:
    other = RunnerGroup.objects.create(organization=acme, name="other")
    r = owner_admin.post(
        url("runnergroup", "change", other.pk),
        {"name": group.name, "kind": "self_hosted", "labels": "{}", "max_concurrent_runs": "1"},
    )
    assert r.status_code == 200
    assert "name" in r.context["adminform"].form.errors
    other.refresh_from_db()
    assert other.name == "other"


def test_it_cannot_edit_drained_or_token_version_by_form(owner_admin: Client, group: RunnerGroup) -> None:
    owner_admin.post(
        url("runnergroup", "change", group.pk),
        {"name": "linux", "kind": "self_hosted", "labels": "{}", "max_concurrent_runs": "1", "drained": "on",
         "token_version": "9"},
    )  # fmt: skip
    group.refresh_from_db()
    assert (group.drained, group.token_version, group.max_concurrent_runs) == (False, 1, 1)


def test_archived_groups_leave_the_list_unless_asked_and_take_no_change(
    owner_admin: Client, acme: Organization, group: RunnerGroup
) -> None:
    gone, _ = services.runner_group_create(org=acme, name="gone")
    services.runner_group_archive(group=gone)

    def listed(query: dict[str, str]) -> set[str]:
        response = owner_admin.get(url("runnergroup"), query)
        assert response.status_code == 200
        return {g.name for g in response.context["cl"].result_list}

    assert listed({}) == {"linux"}  # live ones, as the pages and the API list them
    assert listed({"archived": "yes"}) == {"gone"}
    assert listed({"archived": "all"}) == {"linux", "gone"}

    # Read-only: the page shows it, a change is refused, and the actions leave it as it is.
    assert owner_admin.get(url("runnergroup", "change", gone.pk)).status_code == 200
    refused = owner_admin.post(
        url("runnergroup", "change", gone.pk),
        {"name": "renamed", "kind": "self_hosted", "labels": "{}", "max_concurrent_runs": "1"},
    )
    assert refused.status_code == 403
    for action in ("rotate_token", "drain"):
        # Only a list showing archived groups can select one (the action acts on the filtered list).
        r = owner_admin.post(
            url("runnergroup") + "?archived=all",
            {"action": action, "_selected_action": [gone.pk, group.pk], "index": "0"},
            follow=True,
        )
        assert any("gone: the runner group is archived" in m for m in messages_of(r)), action
    gone.refresh_from_db()
    group.refresh_from_db()
    assert (gone.name, gone.drained, gone.token_version) == ("gone", False, 2)  # archiving bumped it once
    assert (group.drained, group.token_version) == (True, 2)


def test_a_new_group_may_take_an_archived_ones_name(
    owner_admin: Client, acme: Organization, group: RunnerGroup
) -> None:
    services.runner_group_archive(group=group)
    r = owner_admin.post(
        url("runnergroup", "add"),
        {"organization": acme.pk, "name": "Linux", "kind": "self_hosted", "labels": "{}", "max_concurrent_runs": "1"},
    )
    assert r.status_code == 302, r.context and r.context["adminform"].form.errors
    assert RunnerGroup.objects.filter(organization=acme, name__iexact="linux").count() == 2
