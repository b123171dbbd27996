"""A reaper transition that makes a run claimable wakes parked polls (NOTIFY, migration 0004's triggers)."""

from __future__ import annotations

import psycopg
import pytest

from gantry.core.models import Organization, RunnerGroup, Stack
from gantry.reapers.reapers import inactive_runners, reset_expired_assignments, startup_deadline

from ..conftest import drain_notifications
from .helpers import T0, after, at, claim_at, claimable, deploy

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_wakes_polls_when_a_stub_goes_but_not_on_a_lease_reset(
    claimable_listener: psycopg.Connection, acme: Organization, group: RunnerGroup, stack: Stack
) -> None:
    run = deploy(stack, now=T0)
    claim_at(group, T0)
    drain_notifications(claimable_listener)

    reset_expired_assignments(now=after(T0, "assignment_ttl", 1))
    assert drain_notifications(claimable_listener) == []  # pending, but its runner may still boot: nothing to claim yet

    inactive_runners(now=after(T0, "stub_cutoff", 1))
    assert drain_notifications(claimable_listener) == [str(acme.id)]  # the stub's row went: the run is claimable
    assert claimable(run)


def test_it_wakes_polls_when_a_timed_out_run_promotes_the_next(
    claimable_listener: psycopg.Connection, acme: Organization, stack: Stack
) -> None:
    deploy(stack, now=T0)
    deploy(stack, now=at(1))
    drain_notifications(claimable_listener)

    startup_deadline(now=after(T0, "runner_startup_deadline", 1))

    assert drain_notifications(claimable_listener) == [str(acme.id)]
