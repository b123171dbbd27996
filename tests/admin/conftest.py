"""Admin fixtures: browser sessions for the shared personas, and runs to act on."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from gantry.core import services
from gantry.core.models import Membership, Organization, Role, Run, RunnerGroup, Stack


def _session(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner_admin(owner: User) -> Client:
    return _session(owner)


@pytest.fixture
def outsider_admin(outsider: User) -> Client:
    return _session(outsider)


@pytest.fixture
def root_admin(root: User) -> Client:
    return _session(root)


@pytest.fixture
def staff_member(acme: Organization) -> User:
    """Staff (so the admin site lets them in) but only a member of acme: no Gantry models."""
    user = User.objects.create_user(username="staffer", password="pw-staffer", is_staff=True)
    Membership.objects.create(user=user, organization=acme, role=Role.MEMBER)
    return user


@pytest.fixture
def run(stack: Stack) -> Run:
    return services.deployment_create(stack=stack).runs.get()


@pytest.fixture
def globex_run(globex_stack: Stack) -> Run:
    return services.deployment_create(stack=globex_stack).runs.get()


@pytest.fixture
def globex_group(globex: Organization) -> RunnerGroup:
    group, _token = services.runner_group_create(org=globex, name="globex-linux", labels={"os": "linux"})
    return group
