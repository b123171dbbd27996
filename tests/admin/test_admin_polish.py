"""Admin polish: no DatabaseDefault on add forms, event times with seconds, the runs list's group and reason
columns, groups titled by org slug, and names unique whatever their case (the migration included)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from rest_framework.test import APIClient

from gantry.core import services
from gantry.core.errors import NameTaken
from gantry.core.models import Organization, RunnerGroup, Stack
from tests.admin.helpers import url
from tests.conftest import SPEC
from tests.dispatch.helpers import deploy
from tests.queue.helpers import poll


@pytest.mark.django_db
@pytest.mark.parametrize("model", ["runnergroup", "stack", "organization"])
def test_add_forms_show_no_database_default_marker(root_admin: Client, acme: Organization, model: str) -> None:
    page = root_admin.get(url(model, "add"))
    assert page.status_code == 200
    assert b"DatabaseDefault" not in page.content


@pytest.mark.django_db
def test_membership_rows_show_no_marker_either(root_admin: Client, acme: Organization, teammate: User) -> None:
    assert b"DatabaseDefault" not in root_admin.get(url("organization", "change", acme.pk)).content


@pytest.mark.django_db
def test_event_times_have_seconds_and_the_runs_list_has_group_and_reason(
    owner_admin: Client, stack: Stack, group: RunnerGroup
) -> None:
    claimed = deploy(stack)
    assert poll(group) is not None
    waiting = deploy(services.stack_create(org=stack.organization, name="api", labels=stack.labels, spec=SPEC))

    listing = owner_admin.get(url("run")).content.decode()
    assert "acme/linux" in listing  # the claimed run's group, titled by org slug and name
    assert "runner_booting" in listing  # the claimed run
    assert "dispatchable" in listing  # the waiting one: the group polled a moment ago
    detail = owner_admin.get(url("run", "change", claimed.pk)).content.decode()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", detail)
    assert str(waiting.id)[:8] in listing


@pytest.mark.django_db
def test_names_are_unique_whatever_the_case(owner_api: APIClient, acme: Organization, group: RunnerGroup) -> None:
    response = owner_api.post("/api/v1/orgs/acme/runner-groups", {"name": "LINUX"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "name_taken"
    services.stack_create(org=acme, name="Web")
    with pytest.raises(NameTaken):
        services.stack_create(org=acme, name="wEB")
    assert str(RunnerGroup.objects.select_related("organization").get(id=group.id)) == "acme/linux"


@pytest.mark.django_db(transaction=True)
def test_the_migration_renames_case_duplicates_instead_of_failing() -> None:
    executor = MigrationExecutor(connection)
    before = [("core", "0011_invitations")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    org = old.get_model("core", "Organization").objects.create(slug="dup", name="Dup")
    Group = old.get_model("core", "RunnerGroup")
    first = Group.objects.create(organization_id=org.id, name="linux")
    second = Group.objects.create(organization_id=org.id, name="Linux")

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    names = dict(RunnerGroup.objects.filter(organization_id=org.id).values_list("id", "name"))
    assert names == {first.id: "linux", second.id: f"Linux-{second.id}"}
