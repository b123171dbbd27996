"""The hot runner edges' round trips (gantry/sql/runs.py and runners.py, docs/performance.md "Runner routes").

Read from libpq's own protocol trace of the test's connection, as
tests/dispatch/test_claim_transaction.py does for the claim: once the
statements are prepared on the session, authentication is one EXECUTE,
accept one EXECUTE, /status one simple-query message (BEGIN; SET LOCAL; EXECUTE;
COMMIT), done one (the lane lock and the finish). The tests commit for real
(``transaction=True``): the own-transaction paths only run in autocommit.
"""

from __future__ import annotations

import re
import uuid

import pytest

from gantry.api.auth import BearerJWTAuthentication
from gantry.core import services, tokens
from gantry.core.models import Organization, Run, RunnerGroup, RunStatus
from gantry.dispatch.claim import claim, forget_taken_ahead
from gantry.sql import runners as runner_sql
from gantry.sql import runs as run_sql
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.dispatch.test_claim_transaction import in_transaction, wire

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_buckets")]


def _round_trips(sent: list[tuple[str, str]]) -> int:
    # A simple Query, or an extended-protocol exchange ending in Sync, waits for the server once.
    return sum(1 for kind, _ in sent if kind in ("Query", "Sync"))


def _accepted(org: Organization, group: RunnerGroup, name: str) -> tuple[uuid.UUID, uuid.UUID]:
    run = deploy(make_stack(org, name, {"os": "linux"}))
    won = claim(group=group)
    assert won is not None
    assert won.run_id == run.id
    services.run_accept(run_id=run.id, runner_id=won.runner_id)
    return run.id, won.runner_id


def test_it_checks_a_runner_token_in_one_round_trip(acme: Organization) -> None:
    group = make_group(acme, "linux", {"os": "linux"})
    run, runner = _accepted(acme, group, "a")
    token = tokens.mint_runner_token(runner_id=runner, run_id=run, group_id=group.id)
    auth = BearerJWTAuthentication()
    claims = tokens.decode(token)
    auth._runner(claims)  # prepares the statement on this session
    with wire() as sent:
        principal = auth._runner(claims)
    assert principal.runner.id == runner
    assert _round_trips(sent) == 1, sent
    assert re.fullmatch(r'"EXECUTE gantry_auth_runner_\w+ \(.*\)"', sent[0][1]), sent  # no parse, no plan


def test_it_answers_status_in_one_message_without_waiting_for_the_flush(acme: Organization) -> None:
    group = make_group(acme, "linux", {"os": "linux"})
    run, runner = _accepted(acme, group, "a")
    services.runner_status(runner_id=runner, runner_group_id=group.id, run_id=run, bound=True)
    with wire() as sent:
        found, status = services.runner_status(runner_id=runner, runner_group_id=group.id, run_id=run, bound=True)
    assert (found, status) == (True, RunStatus.RUNNING)
    assert _round_trips(sent) == 1, sent
    assert re.fullmatch(
        rf'"BEGIN; SET LOCAL synchronous_commit = off; EXECUTE {runner_sql.STATUS.name} \(.*\); COMMIT"', sent[0][1]
    ), sent
    assert not in_transaction()


def test_it_accepts_in_one_round_trip(acme: Organization) -> None:
    group = make_group(acme, "linux", {"os": "linux"})
    _accepted(acme, group, "warm")  # prepares accept on this session
    run = deploy(make_stack(acme, "b", {"os": "linux"}))
    won = claim(group=group)
    assert won is not None
    with wire() as sent:
        accepted, _ = services.run_accept(run_id=run.id, runner_id=won.runner_id)
    assert accepted.status == RunStatus.RUNNING
    assert accepted.deployment.spec == Run.objects.get(id=run.id).deployment.spec
    assert _round_trips(sent) == 1, sent
    assert sent[0][1].startswith(f'"EXECUTE {run_sql.MOVES_ONE["accept"].name} ('), sent  # its own transaction


def test_it_finishes_a_run_in_one_round_trip(acme: Organization) -> None:
    group = make_group(acme, "linux", {"os": "linux"})
    warm, warm_runner = _accepted(acme, group, "warm")
    services.run_finish(run_id=warm, runner_id=warm_runner, outcome="succeeded", exit_code=0)
    run, runner = _accepted(acme, group, "b")
    with wire() as sent:
        done = services.run_finish(run_id=run, runner_id=runner, outcome="failure", exit_code=3)
    assert (done.status, done.exit_code) == (RunStatus.FAILURE, 3)
    assert _round_trips(sent) == 1, sent
    assert sent[0][1].startswith(f'"BEGIN; EXECUTE {run_sql.LOCK_STACK.name} (')
    assert f"EXECUTE {run_sql.MOVES_ONE['finish'].name} (" in sent[0][1]
    assert sent[0][1].endswith('; COMMIT"')
    assert not in_transaction()


def test_a_poll_whose_token_names_its_org_reads_the_group_in_the_claims_message(acme: Organization) -> None:
    from gantry.server import asyncpoll, lane

    group = make_group(acme, "linux", {"os": "linux"})
    token = tokens.mint_group_token(
        group_id=group.id, token_version=group.token_version, organization_id=group.organization_id
    )
    for name in ("warm", "b", "c"):
        deploy(make_stack(acme, name, {"os": "linux"}))

    def poll() -> lane.Answer | None:
        call = lane.Call(ids={}, token=token, query=b"wait=0", deferred=asyncpoll.Deferred())
        return lane._poll(call)

    warm = poll()  # prepares the statements on this session
    assert warm is not None
    assert warm[0] == 200
    # The ordinary claim (this process remembers nothing of the org's bucket):
    # the group's read, BEGIN and the claim in one message; the throttle; then COMMIT.
    forget_taken_ahead()
    with wire() as sent:
        answer = poll()
    assert answer is not None
    assert answer[0] == 200
    assert _round_trips(sent) == 2, sent
    assert re.match(r'"EXECUTE gantry_auth_group_\w+ \(\d+\); BEGIN; SET LOCAL', sent[0][1]), sent
    assert sent[1][1] == '"COMMIT"', sent
    assert not in_transaction()
    # It won with tokens to spare, so the next one took its token ahead and
    # commits in the same message: one round trip.
    with wire() as sent:
        answer = poll()
    assert answer is not None
    assert answer[0] == 200
    assert _round_trips(sent) == 1, sent
    assert re.match(r'"EXECUTE gantry_auth_group_\w+ \(\d+\); BEGIN; SET LOCAL', sent[0][1]), sent
    assert sent[0][1].endswith('; COMMIT"'), sent
    assert not in_transaction()
