"""Two runner groups of one org racing for one run: one wins, and exactly one token is spent.

Real threads on real connections (``transaction=True``): the loser's claim
statement finds no row under SKIP LOCKED (or finds the run already taken) and
never reaches Redis.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from gantry.core import services
from gantry.dispatch.claim import Claim, claim
from tests.dispatch.helpers import deploy, make_group, make_stack
from tests.throttle.helpers import tokens_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("round_", range(5))
def test_two_groups_racing_for_one_run_spend_exactly_one_token(round_: int) -> None:
    org = services.org_create(slug=f"race-{round_}", name="Race")
    groups = [make_group(org, f"g{i}", {"os": "linux"}) for i in range(2)]
    deploy(make_stack(org, "only", {"os": "linux"}))
    before = tokens_of(org)
    barrier = threading.Barrier(2, timeout=30)
    results: list[Claim | None] = [None, None]
    errors: list[BaseException] = []

    def poll(i: int) -> None:
        try:
            barrier.wait()
            results[i] = claim(group=groups[i])
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert not errors, errors
    assert sum(r is not None for r in results) == 1
    spent = before - tokens_of(org)
    assert 0.99 < spent < 1.01  # refill over the test's few milliseconds at 2/h is ~1e-6
