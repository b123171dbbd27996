"""Every transition writes exactly one run_event of its kind (and a promotion one more, on the promoted run)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Max

from gantry.core import services
from gantry.core.errors import Conflict
from gantry.core.models import Run, RunEvent, RunnerGroup, Stack
from tests.core.drive import at, deploy, lease, new_runner, newest_run


class Timeline:
    """Runs one service call at a time and answers the events it wrote."""

    def __init__(self) -> None:
        self.seen = RunEvent.objects.aggregate(m=Max("id"))["m"] or 0

    def step(self, call: Callable[[], Any]) -> list[tuple[Any, str]]:
        call()
        new = list(RunEvent.objects.filter(id__gt=self.seen).order_by("id").values_list("run_id", "kind", "at"))
        self.seen = RunEvent.objects.aggregate(m=Max("id"))["m"] or self.seen
        return [(run_id, kind) for run_id, kind, _ in new]


def test_it_writes_one_event_per_transition_along_every_edge(stack: Stack, group: RunnerGroup) -> None:
    t = Timeline()
    created: dict[str, Run] = {}

    def create(name: str, seconds: int) -> Callable[[], None]:
        def call() -> None:
            created[name] = deploy(stack, now=at(seconds))

        return call

    # queued ──promote──> pending ──poll──> assigned ──accept──> running ──done──> succeeded
    assert t.step(create("a", 0)) == [(created["a"].id, "created")]
    a = created["a"]
    assert a.status == "pending"

    assert t.step(create("b", 1)) == [(created["b"].id, "created")]
    b = created["b"]
    assert b.status == "queued"

    runner_a = new_runner(group)
    assert t.step(lambda: services.run_assign(run_id=a.id, runner=runner_a, now=at(2))) == [(a.id, "assigned")]
    lapsed = at(2) + lease() + timedelta(seconds=1)
    assert t.step(lambda: services.run_reset_lease(run_id=a.id, now=lapsed)) == [(a.id, "lease_expired")]
    services.runner_deregister(runner_id=runner_a.id, now=lapsed)  # no event: the runner, not the run, goes
    runner_a2 = new_runner(group)
    assert t.step(lambda: services.run_assign(run_id=a.id, runner=runner_a2, now=lapsed)) == [(a.id, "assigned")]
    assert t.step(lambda: services.run_accept(run_id=a.id, runner_id=runner_a2.id, now=lapsed)) == [(a.id, "accepted")]
    done = lapsed + timedelta(seconds=10)
    assert t.step(lambda: services.run_finish(run_id=a.id, outcome="succeeded", exit_code=0, now=done)) == [
        (a.id, "finished"),
        (b.id, "promoted"),
    ]

    # running ──cancel──> requested_cancellation ──ack──> cancelling ──done──> cancelled (promotes c)
    runner_b = new_runner(group)
    assert t.step(lambda: services.run_assign(run_id=b.id, runner=runner_b, now=done)) == [(b.id, "assigned")]
    assert t.step(lambda: services.run_accept(run_id=b.id, runner_id=runner_b.id, now=done)) == [(b.id, "accepted")]
    assert t.step(create("c", 100)) == [(created["c"].id, "created")]
    c = created["c"]
    assert t.step(lambda: services.run_request_cancellation(run_id=b.id, now=done)) == [(b.id, "cancel_requested")]
    assert t.step(lambda: services.run_request_cancellation(run_id=b.id, now=done)) == []  # idempotent: no event
    assert t.step(lambda: services.run_acknowledge_cancel(run_id=b.id, now=done)) == [(b.id, "cancel_acknowledged")]
    assert t.step(lambda: services.run_finish(run_id=b.id, outcome="cancelled", now=done)) == [
        (b.id, "finished"),
        (c.id, "promoted"),
    ]

    # pending ── cancel before start ──> cancelled (promotes d)
    assert t.step(create("d", 200)) == [(created["d"].id, "created")]
    d = created["d"]
    assert t.step(lambda: services.run_request_cancellation(run_id=c.id, now=done)) == [
        (c.id, "cancelled"),
        (d.id, "promoted"),
    ]

    # queued ── skip ──> discarded (no promotion: d holds the lane); then d: startup_timeout (promotes f)
    assert t.step(create("e", 300)) == [(created["e"].id, "created")]
    e = created["e"]
    assert t.step(create("f", 301)) == [(created["f"].id, "created")]
    f = created["f"]
    assert t.step(lambda: services.deployment_skip(deployment_id=e.deployment_id, now=done)) == [(e.id, "skipped")]
    assert t.step(lambda: services.run_startup_timeout(run_id=d.id, now=done)) == [
        (d.id, "startup_timeout"),
        (f.id, "promoted"),
    ]

    # assigned ── dispatch failed ──> failure; then a retry: one "created" event on the new attempt
    runner_f = new_runner(group)
    assert t.step(lambda: services.run_assign(run_id=f.id, runner=runner_f, now=done)) == [(f.id, "assigned")]
    assert t.step(lambda: services.run_fail(run_id=f.id, reason="spawn failed", event="dispatch_failed", now=done)) == [
        (f.id, "dispatch_failed")
    ]
    events = t.step(lambda: services.deployment_retry(deployment_id=f.deployment_id, now=done))
    retry = newest_run(f.deployment_id)
    assert events == [(retry.id, "created")]
    assert RunEvent.objects.get(run=retry).detail["retry_of"] == str(f.id)

    # running ── accept undeliverable ──> failure
    runner_r = new_runner(group)
    assert t.step(lambda: services.run_assign(run_id=retry.id, runner=runner_r, now=done)) == [(retry.id, "assigned")]
    assert t.step(lambda: services.run_accept(run_id=retry.id, runner_id=runner_r.id, now=done)) == [
        (retry.id, "accepted")
    ]

    def accept_again() -> None:
        with pytest.raises(Conflict, match="not delivered"):
            services.run_accept(run_id=retry.id, runner_id=runner_r.id, now=done)

    assert t.step(accept_again) == [(retry.id, "accept_response_undeliverable")]


def test_it_stamps_each_event_with_the_transition_time(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=at(0))
    runner = new_runner(group)
    services.run_assign(run_id=run.id, runner=runner, now=at(5))
    services.run_accept(run_id=run.id, runner_id=runner.id, now=at(9))
    services.run_finish(run_id=run.id, outcome="failure", exit_code=7, now=at(12))

    events = list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", "at", "detail"))
    assert events == [
        ("created", at(0), {"status": "pending", "attempt": 1}),
        ("assigned", at(5), {"runner_id": str(runner.id), "runner_group_id": group.id}),
        ("accepted", at(9), {"runner_id": str(runner.id)}),
        ("finished", at(12), {"outcome": "failure", "exit_code": 7}),
    ]
