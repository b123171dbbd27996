"""Two server processes: one new run still costs one claim attempt (gantry.server.asyncpoll, the leader).

Its own module: the other module's server (one more process wanting to lead)
is stopped by then, so the two workers here are the only candidates.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gantry.core.models import Organization
from tests.asgi.server import POLL, Answer, asgi_server, get, wait_until
from tests.asgi.test_asgi_poll import linux_group, token_of
from tests.dispatch.helpers import deploy, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

FLEET_FIRST = 'gantry_poll_fleet_claim_attempts_total{kind="first"}'
FLEET_WAKE = 'gantry_poll_fleet_claim_attempts_total{kind="wake"}'


def test_with_two_workers_one_new_run_costs_one_claim_attempt(acme: Organization, tmp_path: Path) -> None:
    # Both workers hear the NOTIFY; only the leader's poll (or, when it has none, one follower's) tries.
    # The fleet figures are summed over both workers through Redis (flushed about once a second).
    group = linux_group(acme)
    stack = make_stack(acme, "web", {"os": "linux"})
    n = 8
    with asgi_server(tmp_path, workers=2) as two:
        first, wakes = two.metric(FLEET_FIRST), two.metric(FLEET_WAKE)
        answers: list[Answer] = []
        threads = [
            threading.Thread(target=lambda: answers.append(get(two.base, f"{POLL}?wait=10", token=token_of(group))))
            for _ in range(n)
        ]
        for t in threads:
            t.start()
        wait_until(lambda: two.metric(FLEET_FIRST) == first + n, "the polls never made their first attempts")
        time.sleep(0.5)  # bounded: lets the last first attempt park; nothing depends on the figure
        run = deploy(stack)
        wait_until(lambda: len(answers) == 1, "the new run woke no poll", seconds=8)
        assert answers[0].status == 200
        assert answers[0].body["run_id"] == str(run.id)
        for t in threads:
            t.join(20)
        assert sorted(a.status for a in answers) == [200] + [204] * (n - 1)
        wait_until(lambda: two.metric(FLEET_WAKE) == wakes + 1, "the wake attempt was never counted")
        time.sleep(1.5)  # both workers flush again: nothing more was attempted
        assert (two.metric(FLEET_FIRST), two.metric(FLEET_WAKE)) == (first + n, wakes + 1)
