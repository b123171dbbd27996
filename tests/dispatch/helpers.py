"""Small builders shared by the dispatch tests; every write goes through ``gantry.core.services``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gantry import conf
from gantry.core import services
from gantry.core.models import SELECTOR_PREFIX, Organization, Run, RunnerGroup, Stack
from tests.conftest import SPEC

# A fixed origin for tests that state their times explicitly.
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ttl() -> timedelta:
    return timedelta(seconds=conf.get().assignment_ttl)


def make_stack(org: Organization, name: str, selector: dict[str, str] | None = None) -> Stack:
    """A stack whose runs carry ``selector`` (written as ``gantry:runner-group:`` labels)."""
    labels = {SELECTOR_PREFIX + key: value for key, value in (selector or {}).items()}
    return services.stack_create(org=org, name=name, labels=labels, spec=SPEC)


def make_group(org: Organization, name: str, labels: dict[str, str], **fields: object) -> RunnerGroup:
    group, _token = services.runner_group_create(org=org, name=name, labels=labels, **fields)
    return group


def deploy(stack: Stack, *, now: datetime | None = None) -> Run:
    """Queue a deployment on ``stack`` and answer its run."""
    deployment = services.deployment_create(stack=stack, now=now)
    return Run.objects.get(deployment=deployment)


def runner_count(group: RunnerGroup) -> int:
    return RunnerGroup.objects.values_list("runner_count", flat=True).get(id=group.id)
