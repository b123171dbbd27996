"""The claim's transaction and round trips (gantry/dispatch/claim.py, docs/performance.md P4).

A poll runs in autocommit, so the claim opens and ends its own transaction:
BEGIN, ``SET LOCAL synchronous_commit = off`` (docs/decisions.md, 13) and the
EXECUTE of the prepared statement travel in one message, then the throttle,
then COMMIT (or ROLLBACK). What goes over the wire is read from
libpq's own protocol trace of the test's connection. Inside a caller's
transaction the claim takes a savepoint and leaves the commit to the caller.
These tests commit for real (``transaction=True``): the own-transaction path
only runs outside an atomic block.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection, transaction
from psycopg import pq

from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus, Stack
from gantry.dispatch import throttle
from gantry.dispatch.claim import claim
from gantry.sql.claim import CLAIM
from tests.dispatch.helpers import deploy, make_group, make_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]


@pytest.fixture
def linux(acme: Organization) -> RunnerGroup:
    return make_group(acme, "linux", {"os": "linux"})


def pending_run(org: Organization, name: str) -> Run:
    return deploy(make_stack(org, name, {"os": "linux"}))


@contextmanager
def wire(pgconn: pq.abc.PGconn | None = None) -> Iterator[list[tuple[str, str]]]:
    """What this thread's database connection (or ``pgconn``) sends: (message type, text) for each frontend
    message."""
    if pgconn is None:
        connection.ensure_connection()
        pgconn = connection.connection.pgconn
    sent: list[tuple[str, str]] = []
    with tempfile.TemporaryFile(mode="w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.seek(0)
            for line in trace.read().splitlines():
                parts = line.split("\t")
                if parts[0] == "F":  # frontend → server
                    sent.append((parts[2], parts[3].strip() if len(parts) > 3 else ""))


def in_transaction() -> bool:
    return connection.connection.info.transaction_status != pq.TransactionStatus.IDLE


def drain_bucket(org: Organization) -> None:
    """Spend the org's whole burst (rate 1/h: 24 tokens) through the throttle itself."""
    services.org_set_runs_per_hour_limit(org=org, limit=1)
    while throttle.take(organization_id=org.id, rate=1).allowed:
        pass


def test_a_won_claim_is_one_message_for_begin_and_claim_then_one_commit(acme: Organization, linux: RunnerGroup) -> None:
    assert claim(group=linux) is None  # the session's first claim prepares the statement
    run = pending_run(acme, "a")

    with wire() as sent:
        won = claim(group=linux)

    assert won is not None
    assert won.run_id == run.id
    assert [kind for kind, _ in sent] == ["Query", "Query"], sent  # no BEGIN of its own, no Parse/Bind
    assert re.fullmatch(rf'"BEGIN; SET LOCAL synchronous_commit = off; EXECUTE {CLAIM.name} \(.*\)"', sent[0][1]), sent[
        0
    ]
    assert sent[1][1] == '"COMMIT"'
    assert not in_transaction()
    # Committed: another connection sees the assignment and the stub.
    with psycopg.connect(**connection.get_connection_params()) as other:
        row = other.execute("SELECT status, assigned_runner_id FROM run WHERE id = %s", [run.id]).fetchone()
    assert row == (RunStatus.ASSIGNED, won.runner_id)


def test_only_the_claims_own_transaction_skips_the_wal_flush_wait(acme: Organization, linux: RunnerGroup) -> None:
    pending_run(acme, "a")
    assert claim(group=linux) is not None

    with connection.cursor() as cur:  # same session, after the claim: back to the server's setting
        cur.execute("SHOW synchronous_commit")
        assert cur.fetchone() == ("on",)


def test_an_empty_poll_commits_its_stamp_in_two_queries(linux: RunnerGroup) -> None:
    claim(group=linux)  # prepared

    with wire() as sent:
        assert claim(group=linux) is None

    assert [text for _, text in sent][1:] == ['"COMMIT"'], sent
    assert not in_transaction()
    assert RunnerGroup.objects.get(id=linux.id).last_polled_at is not None


def test_a_throttled_claim_rolls_back_its_own_transaction(acme: Organization, linux: RunnerGroup) -> None:
    run = pending_run(acme, "a")
    drain_bucket(acme)

    with wire() as sent:
        assert claim(group=linux) is None

    assert '"ROLLBACK"' in [text for _, text in sent]
    assert not in_transaction()
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING
    assert Run.objects.get(id=run.id).assigned_runner_id is None
    assert not Runner.objects.filter(runner_group=linux).exists()
    acme.refresh_from_db()
    assert acme.dispatch_throttled_until is not None  # stamped in a transaction of its own, after the rollback


def test_it_prepares_again_when_the_session_lost_its_statement(acme: Organization, linux: RunnerGroup) -> None:
    pending_run(acme, "a")
    pending_run(acme, "b")
    assert claim(group=linux) is not None
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL would do behind the claim's back

    assert claim(group=linux) is not None
    assert not in_transaction()
    assert Runner.objects.filter(runner_group=linux).count() == 2


def test_in_a_callers_transaction_the_claim_leaves_the_commit_to_the_caller(
    acme: Organization, linux: RunnerGroup
) -> None:
    run = pending_run(acme, "a")

    with transaction.atomic():
        won = claim(group=linux)
        assert won is not None
        assert Run.objects.get(id=run.id).status == RunStatus.ASSIGNED
        transaction.set_rollback(True)  # the caller changes its mind

    assert Run.objects.get(id=run.id).status == RunStatus.PENDING
    assert not Runner.objects.filter(runner_group=linux).exists()


def test_in_a_callers_transaction_a_throttled_claim_undoes_only_itself(acme: Organization, linux: RunnerGroup) -> None:
    run = pending_run(acme, "a")
    drain_bucket(acme)

    with transaction.atomic():
        before = make_stack(acme, "written-before-the-claim")  # the caller's own work
        assert claim(group=linux) is None
        with connection.cursor() as cur:  # the transaction is still usable
            cur.execute("SELECT 1")

    assert Stack.objects.filter(id=before.id).exists()
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING
    assert not Runner.objects.filter(runner_group=linux).exists()


def test_in_a_callers_transaction_it_prepares_again_when_the_session_lost_its_statement(
    acme: Organization, linux: RunnerGroup
) -> None:
    pending_run(acme, "a")
    claim(group=linux)
    pending_run(acme, "b")

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("DEALLOCATE ALL")
        assert claim(group=linux) is not None

    assert Runner.objects.filter(runner_group=linux).count() == 2
