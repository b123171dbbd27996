"""Taking the token ahead of the claim (docs/throttle.md, "Taking the token ahead").

Real claims in their own transactions (``transaction=True``) against the test
PostgreSQL and Redis. Whether a token was spent *before* the claim statement
is seen from outside: another session holds the group's row, so the claim
statement waits on it, and the bucket is read while it waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection

from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch import claim as claim_module
from gantry.dispatch import throttle
from gantry.dispatch.claim import AHEAD_MARGIN, Claim, claim
from tests.throttle.helpers import backlog, dispatches, tokens_of, wide_group

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _nothing_remembered() -> Iterator[None]:
    # Org ids come back after a flush; what a process remembers of a bucket must not.
    claim_module.forget_taken_ahead()
    yield
    claim_module.forget_taken_ahead()


def _org(slug: str, rate: int) -> Organization:
    org = services.org_create(slug=slug, name=slug)
    services.org_set_runs_per_hour_limit(org=org, limit=rate)
    org.refresh_from_db()
    return org


def _busy_org(slug: str, runs: int) -> tuple[Organization, RunnerGroup]:
    """An org at 36/h (burst 864: tokens to spare) with ``runs`` pending, one of them claimed already."""
    org = _org(slug, 36)
    backlog(org, runs)
    group = wide_group(org)
    assert claim(group=group) is not None
    return org, group


def _session_params() -> dict[str, Any]:
    # Django's own parameters: a DSN written from settings_dict broke on an empty PORT (the embedded
    # database's socket), where libpq read "port=dbname=..." as the port.
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


@contextmanager
def group_row_held(group: RunnerGroup) -> Iterator[None]:
    """Another session holds the group's row, so a claim of the group waits inside its statement."""
    with psycopg.connect(**_session_params()) as other:
        other.execute("SELECT 1 FROM runner_group WHERE id = %s FOR UPDATE", [group.id])
        yield
        other.rollback()


def tokens_while_the_claim_waits(group: RunnerGroup, org: Organization) -> tuple[float, float, Claim | None]:
    """(tokens before, tokens while the claim statement waits for the group row, the claim's answer)."""
    before = tokens_of(org)
    answer: list[Claim | None] = []
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            answer.append(claim(group=group))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    with group_row_held(group):
        thread = threading.Thread(target=poll)
        thread.start()
        _wait_for_a_claim_blocked_on_a_lock()
        during = tokens_of(org)
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not errors, errors
    return before, during, answer[0]


def _wait_for_a_claim_blocked_on_a_lock() -> None:
    deadline = time.monotonic() + 10
    with psycopg.connect(**_session_params(), autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ["%gantry_claim_%"],
            ).fetchone()
            if row is not None and row[0] >= 1:
                return
            time.sleep(0.01)
    raise AssertionError("the claim never waited for the group row")


def test_a_busy_org_spends_its_next_token_before_the_claim_statement() -> None:
    org = _org("ahead-busy", 36)  # burst 864: tokens to spare; refill 0.01 token/s
    backlog(org, 3)
    group = wide_group(org)

    # The first claim of the org in this process: the token after the statement.
    before, during, first = tokens_while_the_claim_waits(group, org)
    assert first is not None
    assert during - before > -0.5  # nothing spent while the statement waited
    after_first = tokens_of(org)
    assert 0.99 < before - after_first < 1.01

    # It won with tokens to spare: the next claim spends its token first.
    before, during, second = tokens_while_the_claim_waits(group, org)
    assert second is not None
    assert 0.99 < before - during < 1.01  # spent while the statement still waited
    assert 0.99 < before - tokens_of(org) < 1.01  # and only that one
    assert Run.objects.get(id=second.run_id).status == RunStatus.ASSIGNED
    assert Runner.objects.filter(id=second.runner_id).exists()


def test_a_token_taken_ahead_is_given_back_when_the_claim_finds_no_run() -> None:
    org, group = _busy_org("ahead-empty", 1)
    after_won = tokens_of(org)
    dispatched = dispatches(throttle.DISPATCHED)

    before, during, empty = tokens_while_the_claim_waits(group, org)
    assert empty is None
    assert 0.99 < before - during < 1.01  # taken ahead (the last claim won with tokens to spare)
    left = tokens_of(org)
    assert after_won - 0.01 < left < after_won + 0.1  # given back: the empty poll cost no token
    assert dispatches(throttle.DISPATCHED) == dispatched

    # An empty poll ends it: the next claim of the org goes the ordinary way.
    before, during, again = tokens_while_the_claim_waits(group, org)
    assert again is None
    assert during - before > -0.5


def test_a_rate_changed_since_the_token_was_taken_ahead_decides_the_claim() -> None:
    org, group = _busy_org("ahead-rate", 2)
    after_won = tokens_of(org)
    limited = dispatches(throttle.LIMITED)

    # Rate 0 stops dispatch at once, even for a claim that took its token at the old rate.
    services.org_set_runs_per_hour_limit(org=org, limit=0)
    assert claim(group=group) is None
    assert Run.objects.filter(organization=org, status=RunStatus.PENDING, assigned_runner_id=None).count() == 1
    assert Runner.objects.filter(runner_group=group).count() == 1  # the first claim's stub alone
    assert dispatches(throttle.LIMITED) == limited + 1
    # The token taken at 36/h went back to the bucket.
    left = throttle.peek(organization_id=org.id, rate=36).tokens
    assert after_won - 0.01 < left < after_won + 0.1


def test_a_raised_rate_is_what_the_claim_that_took_ahead_spends_at() -> None:
    org, group = _busy_org("ahead-raise", 2)
    services.org_set_runs_per_hour_limit(org=org, limit=72)
    org.refresh_from_db()
    before = tokens_of(org)

    won = claim(group=group)
    assert won is not None
    # One token in all at the new rate: the one taken at 36/h was given back.
    assert 0.99 < before - tokens_of(org) < 1.01


def test_near_an_empty_bucket_no_token_is_taken_ahead() -> None:
    org = _org("ahead-low", 1)  # burst 24, refill one token an hour
    backlog(org, 24 - int(AHEAD_MARGIN) + 2)
    group = wide_group(org)
    # Spend down to one token under the margin.
    for _ in range(24 - int(AHEAD_MARGIN) + 1):
        assert claim(group=group) is not None
    assert tokens_of(org) < AHEAD_MARGIN

    before, during, won = tokens_while_the_claim_waits(group, org)
    assert won is not None
    assert during - before > -0.5  # the ordinary way: nothing spent while the statement waited
    assert 0.99 < before - tokens_of(org) < 1.01


def test_a_claim_that_fails_after_taking_ahead_gives_the_token_back() -> None:
    org, group = _busy_org("ahead-fail", 2)
    before = tokens_of(org)

    # The claim statement fails (a statement timeout while it waits for the held group row).
    connection.ensure_connection()
    with group_row_held(group):
        with connection.cursor() as cur:
            cur.execute("SET statement_timeout = 200")
        try:
            with pytest.raises(Exception, match="statement timeout"):
                claim(group=group)
        finally:
            with connection.cursor() as cur:
                cur.execute("RESET statement_timeout")
    left = tokens_of(org)
    assert before - 0.01 < left < before + 0.1
    assert Run.objects.filter(organization=org, status=RunStatus.PENDING).count() == 1


@pytest.mark.parametrize("verdict", ["stands", "revoked"])
def test_a_vouched_claim_that_took_ahead_is_judged_by_the_statement_itself(verdict: str) -> None:
    from rest_framework.exceptions import AuthenticationFailed

    from gantry.api.auth import group_check, group_of_row
    from gantry.core import tokens
    from gantry.dispatch.claim import Vouch

    org, group = _busy_org(f"ahead-vouch-{verdict}", 2)
    group.refresh_from_db()
    stamped = group.last_polled_at
    version = group.token_version + (verdict == "revoked")
    claims = tokens.decode(tokens.mint_group_token(group_id=group.id, token_version=version, organization_id=org.id))
    checked = group_check(claims)
    assert checked is not None
    stand_in, (statement, args) = checked
    vouch = Vouch(statement, args, check=lambda row: group_of_row(claims, row) and None, token_version=version)
    before = tokens_of(org)

    if verdict == "stands":
        won = claim(group=stand_in, vouch=vouch)
        assert won is not None
        assert 0.99 < before - tokens_of(org) < 1.01
        return
    with pytest.raises(AuthenticationFailed):
        claim(group=stand_in, vouch=vouch)
    # Refused on the locked row: nothing claimed, no stamp, the token back.
    assert Run.objects.filter(organization=org, status=RunStatus.PENDING, assigned_runner_id=None).count() == 1
    assert Runner.objects.filter(runner_group=group).count() == 1
    group.refresh_from_db()
    assert group.last_polled_at == stamped
    assert before - 0.01 < tokens_of(org) < before + 0.1
