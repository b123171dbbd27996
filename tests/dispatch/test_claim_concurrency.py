"""The claim under real concurrency (docs/design.md §5): slots, SKIP LOCKED, one winner per run.

Each poll runs in its own thread with its own database connection (Django
connections are per thread) and closes it at the end. The threads meet at a
``threading.Barrier`` so their claims overlap; nothing sleeps.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection

from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch.claim import Claim, claim
from tests.dispatch.helpers import deploy, make_group, make_stack, runner_count

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None


def in_threads(n: int, body: Callable[[threading.Barrier], Any]) -> list[Outcome]:
    """Run ``body`` in ``n`` threads at once (each with its own connection); answer what each returned."""
    barrier = threading.Barrier(n, timeout=30)
    outcomes = [Outcome() for _ in range(n)]

    def work(i: int) -> None:
        try:
            outcomes[i].value = body(barrier)
        except BaseException as exc:  # recorded for the test to judge
            outcomes[i].error = exc
            barrier.abort()  # never leave the others waiting
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a claim thread hung"
    errors = [o.error for o in outcomes if o.error is not None]
    assert not errors, errors
    return outcomes


def claim_once(group: RunnerGroup) -> Callable[[threading.Barrier], Claim | None]:
    def body(barrier: threading.Barrier) -> Claim | None:
        barrier.wait()
        return claim(group=group)

    return body


@pytest.mark.parametrize("round_", range(5))
def test_it_never_exceeds_max_concurrent_runs_under_16_concurrent_polls(round_: int) -> None:
    org = services.org_create(slug=f"race-{round_}", name="Race")
    group = make_group(org, "four", {"os": "linux"}, max_concurrent_runs=4)
    runs = [deploy(make_stack(org, f"s{i}", {"os": "linux"})) for i in range(50)]
    assert Run.objects.filter(organization=org, status=RunStatus.PENDING).count() == 50

    outcomes = in_threads(16, claim_once(group))

    won = [o.value for o in outcomes if o.value is not None]
    assert len(won) == 4
    assert len({c.run_id for c in won}) == 4  # no run claimed twice
    assert len({c.runner_id for c in won}) == 4
    assert Runner.objects.filter(runner_group=group).count() == 4
    assert runner_count(group) == 4
    assigned = Run.objects.filter(organization=org, status=RunStatus.ASSIGNED)
    assert set(assigned.values_list("id", flat=True)) == {c.run_id for c in won}
    assert set(assigned.values_list("assigned_runner_id", flat=True)) == {c.runner_id for c in won}
    assert Run.objects.filter(organization=org, status=RunStatus.PENDING).count() == len(runs) - 4


@pytest.mark.parametrize("round_", range(5))
def test_it_gives_a_single_run_to_exactly_one_of_two_racing_groups(round_: int, acme: Organization) -> None:
    g1 = make_group(acme, "g1", {"os": "linux"})
    g2 = make_group(acme, "g2", {"os": "linux", "arch": "amd64"})
    run = deploy(make_stack(acme, "web", {"os": "linux"}))
    groups = [g1, g2]
    lock = threading.Lock()

    def body(barrier: threading.Barrier) -> Claim | None:
        with lock:
            mine = groups.pop()
        barrier.wait()
        return claim(group=mine)

    outcomes = in_threads(2, body)

    won = [o.value for o in outcomes if o.value is not None]
    assert len(won) == 1
    assert won[0].run_id == run.id
    assert Runner.objects.count() == 1
    assert Runner.objects.get().id == won[0].runner_id
    assert runner_count(g1) + runner_count(g2) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.ASSIGNED
    assert run.assigned_runner_id == won[0].runner_id


def test_it_claims_every_run_exactly_once_with_8_pollers_draining(acme: Organization) -> None:
    group = make_group(acme, "wide", {"os": "linux"}, max_concurrent_runs=1000)
    runs = [deploy(make_stack(acme, f"s{i}", {"os": "linux"})) for i in range(40)]

    def claimable_left() -> bool:
        return Run.objects.filter(organization=acme, status=RunStatus.PENDING, assigned_runner__isnull=True).exists()

    def body(barrier: threading.Barrier) -> list[Claim]:
        mine: list[Claim] = []
        barrier.wait()
        for _ in range(500):  # bounded: a false empty just polls again
            got = claim(group=group)
            if got is not None:
                mine.append(got)
            elif not claimable_left():
                break
        return mine

    outcomes = in_threads(8, body)

    claims = [c for o in outcomes for c in o.value]
    per_run = Counter(c.run_id for c in claims)
    assert len(claims) == 40
    assert set(per_run) == {r.id for r in runs}
    assert set(per_run.values()) == {1}
    assert len({c.runner_id for c in claims}) == 40
    assert Run.objects.filter(organization=acme, status=RunStatus.ASSIGNED).count() == 40
    assert Runner.objects.filter(runner_group=group).count() == 40
    assert runner_count(group) == 40
    print(f"8 pollers: claims per poller {sorted(len(o.value) for o in outcomes)}")
