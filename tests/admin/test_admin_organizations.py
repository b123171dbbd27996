"""Organizations: the dispatch budget is a super-admin's; memberships go through services."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from gantry.core.models import Membership, Organization, Role, RunnerGroup
from tests.admin.helpers import form_data, url


def _edit(client: Client, org: Organization, **changes: object) -> dict[str, object]:
    r = client.get(url("organization", "change", org.pk))
    assert r.status_code == 200
    return {**form_data(r.context), **changes}


def test_it_keeps_runs_per_hour_limit_readonly_for_an_org_admin(owner_admin: Client, acme: Organization) -> None:
    data = _edit(owner_admin, acme, name="Acme Corp")
    assert "runs_per_hour_limit" not in data  # not a form field for an org admin
    r = owner_admin.post(url("organization", "change", acme.pk), {**data, "runs_per_hour_limit": "500"})
    assert r.status_code == 302, r.context and r.context["adminform"].form.errors
    acme.refresh_from_db()
    assert acme.name == "Acme Corp"  # the rest of the form did save
    assert acme.runs_per_hour_limit == 2


def test_it_keeps_slug_and_max_in_flight_readonly_for_an_org_admin(owner_admin: Client, acme: Organization) -> None:
    data = _edit(owner_admin, acme, slug="taken-over", max_in_flight="1000")
    owner_admin.post(url("organization", "change", acme.pk), data)
    acme.refresh_from_db()
    assert (acme.slug, acme.max_in_flight) == ("acme", None)


def test_it_lets_root_set_runs_per_hour_limit_and_clears_the_throttle(root_admin: Client, acme: Organization) -> None:
    Organization.objects.filter(pk=acme.pk).update(dispatch_throttled_until=timezone.now() + timedelta(hours=1))
    data = _edit(root_admin, acme, runs_per_hour_limit="60")
    r = root_admin.post(url("organization", "change", acme.pk), data)
    assert r.status_code == 302
    acme.refresh_from_db()
    assert acme.runs_per_hour_limit == 60
    assert acme.dispatch_throttled_until is None  # org_set_runs_per_hour_limit ran


def test_it_never_edits_dispatch_throttled_until(root_admin: Client, acme: Organization) -> None:
    stamp = timezone.now() + timedelta(hours=1)
    Organization.objects.filter(pk=acme.pk).update(dispatch_throttled_until=stamp)
    data = _edit(root_admin, acme, name="Renamed", dispatch_throttled_until="2000-01-01 00:00:00")
    root_admin.post(url("organization", "change", acme.pk), data)
    acme.refresh_from_db()
    assert acme.name == "Renamed"
    assert acme.dispatch_throttled_until == stamp


def test_it_forbids_org_admins_to_create_orgs(owner_admin: Client) -> None:
    assert owner_admin.get(url("organization", "add")).status_code == 403
    r = owner_admin.post(url("organization", "add"), {"slug": "new", "name": "New"})
    assert r.status_code == 403
    assert not Organization.objects.filter(slug="new").exists()


def test_it_lets_root_create_an_org(root_admin: Client) -> None:
    r = root_admin.post(
        url("organization", "add"),
        {
            "slug": "initech",
            "name": "Initech",
            "runs_per_hour_limit": "7",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )
    assert r.status_code == 302, r.context and r.context["adminform"].form.errors
    org = Organization.objects.get(slug="initech")
    assert (org.name, org.runs_per_hour_limit) == ("Initech", 7)


def test_it_sets_the_default_group_within_the_org(owner_admin: Client, acme: Organization, group: RunnerGroup) -> None:
    r = owner_admin.post(
        url("organization", "change", acme.pk), _edit(owner_admin, acme, default_runner_group=group.pk)
    )
    assert r.status_code == 302
    acme.refresh_from_db()
    assert acme.default_runner_group_id == group.pk


def test_it_refuses_another_orgs_group_as_default(
    root_admin: Client, acme: Organization, globex_group: RunnerGroup
) -> None:
    data = _edit(root_admin, acme, default_runner_group=globex_group.pk)
    r = root_admin.post(url("organization", "change", acme.pk), data)
    assert r.status_code == 200
    assert "default_runner_group" in r.context["adminform"].form.errors
    acme.refresh_from_db()
    assert acme.default_runner_group_id is None


def test_it_promotes_a_member_to_admin_through_the_service(
    owner_admin: Client, acme: Organization, teammate: User
) -> None:
    data = _edit(owner_admin, acme)
    index = next(i for i in range(int(data["memberships-TOTAL_FORMS"])) if data[f"memberships-{i}-user"] == teammate.pk)
    data[f"memberships-{index}-role"] = Role.ADMIN
    r = owner_admin.post(url("organization", "change", acme.pk), data)
    assert r.status_code == 302
    assert Membership.objects.get(user=teammate, organization=acme).role == Role.ADMIN
    teammate.refresh_from_db()
    assert teammate.is_staff  # membership_set makes an org admin staff


def test_it_offers_only_own_org_people_for_memberships(
    owner_admin: Client, acme: Organization, teammate: User, outsider: User
) -> None:
    r = owner_admin.get(url("organization", "change", acme.pk))
    formset = r.context["inline_admin_formsets"][0].formset
    people = set(formset.empty_form.fields["user"].queryset)
    assert teammate in people
    assert outsider not in people


def _membership_index(data: dict[str, object], user: User) -> int:
    return next(i for i in range(int(str(data["memberships-TOTAL_FORMS"]))) if data[f"memberships-{i}-user"] == user.pk)


def test_it_never_demotes_or_deletes_the_last_admin(
    owner_admin: Client, owner: User, acme: Organization, teammate: User
) -> None:
    data = _edit(owner_admin, acme)
    data[f"memberships-{_membership_index(data, owner)}-role"] = Role.MEMBER
    r = owner_admin.post(url("organization", "change", acme.pk), data, follow=True)
    assert r.status_code == 200
    assert "last admin" in " ".join(str(m) for m in r.context["messages"])
    assert Membership.objects.get(user=owner, organization=acme).role == Role.ADMIN

    data = _edit(owner_admin, acme)
    data[f"memberships-{_membership_index(data, owner)}-DELETE"] = "on"
    r = owner_admin.post(url("organization", "change", acme.pk), data, follow=True)
    assert "last admin" in " ".join(str(m) for m in r.context["messages"])
    assert Membership.objects.filter(user=owner, organization=acme).exists()


def test_it_promotes_one_admin_and_removes_the_other_in_one_save(
    owner_admin: Client, owner: User, acme: Organization, teammate: User
) -> None:
    data = _edit(owner_admin, acme)
    data[f"memberships-{_membership_index(data, teammate)}-role"] = Role.ADMIN
    data[f"memberships-{_membership_index(data, owner)}-DELETE"] = "on"
    r = owner_admin.post(url("organization", "change", acme.pk), data)
    assert r.status_code == 302
    assert dict(Membership.objects.filter(organization=acme).values_list("user__username", "role")) == {
        "teammate": "admin"
    }
