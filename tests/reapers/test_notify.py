"""A reaper transition that makes a run claimable wakes parked polls (NOTIFY, migration 0004's triggers)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from gantry.core.models import Organization, RunnerGroup, Stack
from gantry.reapers.reapers import inactive_runners, reset_expired_assignments, startup_deadline

from .helpers import T0, after, at, claim_at, claimable, deploy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listen() -> Iterator[psycopg.Connection]:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("LISTEN gantry_claimable")
        yield conn


def _drain(conn: psycopg.Connection) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5)]


def test_it_wakes_polls_when_a_stub_goes_but_not_on_a_lease_reset(
    listen: psycopg.Connection, acme: Organization, group: RunnerGroup, stack: Stack
) -> None:
    run = deploy(stack, now=T0)
    claim_at(group, T0)
    _drain(listen)

    reset_expired_assignments(now=after(T0, "assignment_ttl", 1))
    assert _drain(listen) == []  # pending, but its runner may still boot: nothing to claim yet

    inactive_runners(now=after(T0, "stub_cutoff", 1))
    assert _drain(listen) == [str(acme.id)]  # the stub's row went: the run is claimable
    assert claimable(run)


def test_it_wakes_polls_when_a_timed_out_run_promotes_the_next(
    listen: psycopg.Connection, acme: Organization, stack: Stack
) -> None:
    deploy(stack, now=T0)
    deploy(stack, now=at(1))
    _drain(listen)

    startup_deadline(now=after(T0, "runner_startup_deadline", 1))

    assert _drain(listen) == [str(acme.id)]
