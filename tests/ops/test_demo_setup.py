"""``manage.py demo_setup``: the demo org, group and stack, created once."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command

from gantry.core import specs, tokens
from gantry.core.models import Membership, Organization, Role, RunnerGroup, Stack

pytestmark = pytest.mark.django_db

JWT = re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]+")


def _demo_setup() -> str:
    out = StringIO()
    call_command("demo_setup", "--admin", "demo-admin", stdout=out)
    return out.getvalue()


def test_it_sets_up_the_demo_once_and_shows_the_token_once() -> None:
    first = _demo_setup()
    second = _demo_setup()

    assert Organization.objects.filter(slug="demo").count() == 1
    assert RunnerGroup.objects.filter(organization__slug="demo").count() == 1
    assert Stack.objects.filter(organization__slug="demo").count() == 1
    group = RunnerGroup.objects.get(organization__slug="demo", name="local")
    stack = Stack.objects.get(organization__slug="demo", name="hello")
    assert group.labels == {"os": "linux"}
    assert stack.labels == {"gantry:runner-group:os": "linux"}
    assert stack.runner_selector.items() <= group.labels.items()
    assert Membership.objects.get(organization__slug="demo", user__username="demo-admin").role == Role.ADMIN

    match = re.search(r"group token .*: (\S+)$", first, re.MULTILINE)
    assert match, first
    claims = tokens.decode(match.group(1))
    assert claims.audience == tokens.AUD_GROUP
    assert claims.subject == str(group.id)
    assert claims.raw["ver"] == group.token_version

    assert match.group(1) not in second
    assert JWT.search(second) is None, second
    assert f"runner-groups/{group.id}/rotate-token" in second
    assert "'local' (id" in second
    assert "exists" in second


def test_it_gives_the_demo_stack_a_valid_spec_that_takes_a_few_seconds() -> None:
    _demo_setup()
    spec = Stack.objects.get(organization__slug="demo", name="hello").spec
    assert specs.validate_spec(spec) == spec
    assert any("sleep" in step["run"] for step in spec["steps"])


def test_it_leaves_existing_demo_objects_as_they_are() -> None:
    _demo_setup()
    group = RunnerGroup.objects.get(organization__slug="demo", name="local")
    RunnerGroup.objects.filter(id=group.id).update(labels={"os": "linux", "extra": "kept"})
    _demo_setup()
    group.refresh_from_db()
    assert group.labels == {"os": "linux", "extra": "kept"}
    assert group.token_version == 1
