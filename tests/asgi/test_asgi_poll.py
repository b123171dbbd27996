"""The poll under the production ASGI mode (gantry.asgi, gunicorn + uvicorn's worker) as a real server.

The answers must be the WSGI view's (the same request through Django's test
client, in this process); a parked poll holds no thread, so what is checked
here is who gets woken: one new run answers exactly one of N parked polls, the
others stay parked until their deadline; a run whose NOTIFY never came is
claimed by the periodic re-check; SIGTERM answers every parked poll at once.
Counts come from the server's /metrics (one worker: the whole server).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from gantry.core import services, tokens
from gantry.core.models import Organization, Run, RunnerGroup, RunStatus
from gantry.dispatch import throttle
from gantry.dispatch.claim import claim
from tests.asgi.server import POLL, Answer, Server, asgi_server, get, wait_until
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.github.conftest import gha_group

pytestmark = pytest.mark.django_db(transaction=True)

PARKED = "gantry_poll_parked"
FIRST = 'gantry_poll_claim_attempts_total{kind="first"}'
WAKE = 'gantry_poll_claim_attempts_total{kind="wake"}'


@pytest.fixture(scope="module")
def server(
    django_db_setup: None, django_db_blocker: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    # A short re-check so the lost-NOTIFY test does not wait the default 5 s.
    with (
        django_db_blocker.unblock(),
        asgi_server(  # type: ignore[attr-defined]
            tmp_path_factory.mktemp("asgi"), GANTRY_POLL_RECHECK_SECONDS="1"
        ) as s,
    ):
        yield s


def token_of(group: RunnerGroup) -> str:
    # As the services issue them: naming the org, so the lane's first pass sends its check with its claim.
    return tokens.mint_group_token(
        group_id=group.id, token_version=group.token_version, organization_id=group.organization_id
    )


def wsgi(path: str, token: str | None) -> Answer:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.get(path)
    return Answer(response.status_code, response.json() if response.content else None, response.get("Content-Type"))


def both(server: Server, path: str, token: str | None) -> tuple[Answer, Answer]:
    return get(server.base, path, token=token), wsgi(path, token)


def linux_group(org: Organization, name: str = "linux") -> RunnerGroup:
    return make_group(org, name, {"os": "linux"}, max_concurrent_runs=1000)


def test_it_answers_like_the_wsgi_view(server: Server, acme: Organization) -> None:
    group = linux_group(acme)
    token = token_of(group)
    for path, tok in [
        (POLL, None),  # 401 not_authenticated
        (POLL, "not-a-jwt"),  # 401
        (POLL + "?wait=abc", token),  # 400
        (POLL + "?wait=31", token),  # 400
        (POLL + "?wait=-1", token),  # 400
        (POLL, token),  # 204, nothing to claim
        (POLL + "?wait=0", token),  # 204
    ]:
        asgi, plain = both(server, path, tok)
        assert (asgi.status, asgi.body, asgi.content_type) == (plain.status, plain.body, plain.content_type), path

    # A runner's token may not poll; nor may a github_actions group (Gantry dispatches those).
    stack = make_stack(acme, "web", {"os": "linux"})
    deploy(stack)
    won = claim(group=group)
    assert won is not None
    gha = gha_group(acme)
    for tok in (won.runner_token, token_of(gha)):
        asgi, plain = both(server, POLL + "?wait=5", tok)
        assert asgi.status == plain.status == 403
        assert asgi.body == plain.body

    # 200: a claim, the same fields as the WSGI view's.
    services.deployment_create(stack=make_stack(acme, "api", {"os": "linux"}))
    services.deployment_create(stack=make_stack(acme, "db", {"os": "linux"}))
    asgi, plain = both(server, POLL + "?wait=5", token)
    assert asgi.status == plain.status == 200
    assert set(asgi.body) == set(plain.body) == {"run_id", "runner_id", "runner_token", "assigned_expires_at"}
    assert asgi.content_type == plain.content_type
    assert Run.objects.filter(organization=acme, status=RunStatus.ASSIGNED).count() == 3


def test_a_woken_poll_answers_the_views_headers_and_body(server: Server, acme: Organization) -> None:
    group = linux_group(acme)
    token = token_of(group)
    threads, answers = park(server, token, 1, 20)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    threads[0].join(25)
    woken = answers[0]
    assert woken.status == 200
    deploy(make_stack(acme, "api", {"os": "linux"}))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    plain = client.get(POLL + "?wait=5")
    assert plain.status_code == 200
    assert woken.headers is not None
    expected = {k.lower(): v for k, v in plain.headers.items()}
    assert {k: v for k, v in woken.headers.items() if k != "content-length"} == {
        k: v for k, v in expected.items() if k != "content-length"
    }
    assert set(woken.body) == set(plain.json())
    assert int(woken.headers["content-length"]) > 0


def test_a_throttled_long_poll_answers_204_at_once(server: Server, acme: Organization) -> None:
    services.org_set_runs_per_hour_limit(org=acme, limit=1)
    group = linux_group(acme)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    for _ in range(24):
        throttle.take(organization_id=acme.id, rate=1)
    parked = server.metric(PARKED)
    answers: list[Answer] = []
    token = token_of(group)
    poll = threading.Thread(target=lambda: answers.append(get(server.base, POLL + "?wait=30", token=token)))
    poll.start()
    # Not held to its deadline: the budget, not a lack of work, said no. A poll that parked would
    # stay parked for its 30 s, so it would be seen here (get's own timeout is the hang guard).
    while poll.is_alive():
        assert server.metric(PARKED) == parked, "the throttled poll parked"
        poll.join(0.05)
    assert [a.status for a in answers] == [204]
    assert Run.objects.get(organization=acme).status == RunStatus.PENDING


def park(server: Server, token: str, n: int, wait: int) -> tuple[list[threading.Thread], list[Answer]]:
    before = server.metric(PARKED)
    answers: list[Answer] = []
    threads = [
        threading.Thread(target=lambda: answers.append(get(server.base, f"{POLL}?wait={wait}", token=token)))
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: server.metric(PARKED) == before + n, f"{n} polls never parked")
    return threads, answers


def test_one_new_run_answers_exactly_one_of_n_parked_polls(server: Server, acme: Organization) -> None:
    n, wait = 6, 8
    group = linux_group(acme)
    stack = make_stack(acme, "web", {"os": "linux"})
    first, wakes = server.metric(FIRST), server.metric(WAKE)
    threads, answers = park(server, token_of(group), n, wait)
    assert server.metric(FIRST) == first + n  # each poll's first attempt
    assert server.metric(WAKE) == wakes  # and nothing since

    run = deploy(stack)
    wait_until(lambda: len(answers) == 1, "the new run woke no poll", seconds=wait - 2)
    assert answers[0].status == 200
    assert answers[0].body["run_id"] == str(run.id)
    # The others were never woken: still parked, no claim attempt made for them.
    assert server.metric(PARKED) == n - 1
    assert server.metric(WAKE) == wakes + 1

    for t in threads:
        t.join(wait + 10)
    assert sorted(a.status for a in answers) == [200] + [204] * (n - 1)
    assert (server.metric(FIRST), server.metric(WAKE)) == (first + n, wakes + 1)  # a deadline costs no claim
    assert server.metric(PARKED) == 0


def test_a_run_made_claimable_in_one_statement_wakes_as_many_polls_as_it_has_runs(
    server: Server, acme: Organization
) -> None:
    group = linux_group(acme)
    stacks = [make_stack(acme, f"s{i}", {"os": "linux"}) for i in range(3)]
    threads, answers = park(server, token_of(group), 5, 8)
    with transaction.atomic():  # one transaction: one NOTIFY for the org (its payload is the org id)
        for s in stacks:
            services.deployment_create(stack=s)
    wait_until(lambda: len(answers) == 3, "three runs did not answer three polls", seconds=6)
    assert [a.status for a in answers] == [200, 200, 200]
    assert server.metric(PARKED) == 2
    for t in threads:
        t.join(20)
    assert sorted(a.status for a in answers) == [200] * 3 + [204] * 2


def test_a_lost_notify_is_claimed_by_the_periodic_recheck(server: Server, acme: Organization) -> None:
    group = linux_group(acme)
    stack = make_stack(acme, "web", {"os": "linux"})
    threads, answers = park(server, token_of(group), 1, 25)
    with transaction.atomic(), connection.cursor() as cur:
        # Triggers off for this transaction only: the run is created without its NOTIFY.
        cur.execute("SET LOCAL session_replication_role = replica")
        run = deploy(stack)
    threads[0].join(30)
    assert len(answers) == 1
    # 200 before the 25 s deadline (that would be a 204): found by the re-check, not by a wake.
    assert answers[0].status == 200
    assert answers[0].body["run_id"] == str(run.id)


def test_sigterm_answers_every_parked_poll_at_once_and_the_server_exits(acme: Organization, tmp_path: Path) -> None:
    group = linux_group(acme)
    # A graceful timeout shorter than the polls' 30 s wait: without gantry.asgi's SIGTERM hook the
    # server would cut them off unanswered when it ran out, so their 204s say the hook answered them.
    with asgi_server(tmp_path, gunicorn_args=("--graceful-timeout", "20")) as own:
        threads, answers = park(own, token_of(group), 3, 30)
        own.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(45)  # hang guards only
        exit_code = own.process.wait(45)
    assert sorted(a.status for a in answers) == [204, 204, 204], own.tail()
    assert exit_code == 0, own.tail()
