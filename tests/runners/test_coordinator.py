"""The coordinator's loop against ``live_server``, with the in-memory fake launcher.

Turns are driven one at a time (``Coordinator.step``) so each test states
exactly what the coordinator meets; ``run()`` is used where stopping matters.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import pytest

from gantry.core import services
from gantry.core.models import Run, Runner, RunnerGroup, RunStatus
from gantry_wire import protocol
from launchers.fake import FakeLauncher, FakeWorld
from runners.client import GantryClient, RequestAborted
from runners.coordinator import Coordinator, Settings
from tests.runners.conftest import Site, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = Settings(max_parallel=2, wait=1, backoff_base=0.01, backoff_cap=0.05, launch_retry_delay=0, idle_pause=0.01)


def coordinator(site: Site, launcher: FakeLauncher, token: str | None = None, **settings: Any) -> Coordinator:
    merged = Settings(**{**QUICK.__dict__, **settings})
    return Coordinator(GantryClient(site.url, token or site.group_token, timeout=10), launcher, merged)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def second_stack_run(site: Site) -> Run:
    """A run on another stack (one stack's lane holds one run at a time)."""
    other = services.stack_create(org=site.org, name="other", labels={"gantry:runner-group:os": "linux"},
                                  spec={"steps": [{"name": "x", "run": "true"}]})  # fmt: skip
    return Run.objects.get(deployment=services.deployment_create(stack=other))


def test_it_claims_launches_and_reaps(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    run = site.deploy({"steps": [{"name": "x", "run": "true"}]})
    fake = FakeLauncher()
    coord = coordinator(site, fake)

    coord.step()
    assert [a.run_id for a in fake.launched] == [str(run.id)]
    assignment = fake.launched[0]
    assert assignment.server == site.url
    assert assignment.group_id == str(site.group.id) == fake.group_id
    assert Runner.objects.filter(id=assignment.runner_id).exists()
    assert assignment.runner_token
    assert list(coord.workers) == [str(run.id)]
    assert events(caplog, "run.claimed")[0].run_id == str(run.id)  # type: ignore[attr-defined]
    launched = events(caplog, "worker.launched")[0]
    assert launched.getMessage() == f"launched fake worker {fake.worker(str(run.id)).handle.ident} for run {run.id}"

    fake.finish(str(run.id), code=0)
    coord.step()  # reaps first, then polls (nothing there)
    assert coord.workers == {}
    exited = events(caplog, "worker.exited")[0]
    assert exited.getMessage().startswith(f"worker for run {run.id} exited with code 0 after ")
    assert exited.exit_code == 0  # type: ignore[attr-defined]
    assert exited.seconds >= 0  # type: ignore[attr-defined]  # counted from the handle's start


def test_it_reports_a_worker_that_can_never_start_as_dispatch_failed(site: Site) -> None:
    run = site.deploy({"steps": [{"name": "x", "run": "true"}]})
    fake = FakeLauncher()
    coord = coordinator(site, fake)
    coord.step()
    runner_id = fake.launched[0].runner_id

    fake.fail_startup(str(run.id), "image gantry-runner:nope not found")
    coord.step()

    assert coord.workers == {}
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert "image gantry-runner:nope not found" in run.failure_reason
    assert not Runner.objects.filter(id=runner_id).exists()
    group = RunnerGroup.objects.get(id=site.group.id)
    assert group.last_dispatch_error == "image gantry-runner:nope not found"


def test_it_polls_only_while_it_has_free_capacity(site: Site) -> None:
    first = site.deploy({"steps": [{"name": "x", "run": "true"}]})
    second = second_stack_run(site)
    fake = FakeLauncher()
    coord = coordinator(site, fake, max_parallel=1)

    coord.step()
    polled = RunnerGroup.objects.get(id=site.group.id).last_polled_at
    coord.step()  # full: waits for a slot instead of polling
    assert [a.run_id for a in fake.launched] == [str(first.id)]
    assert RunnerGroup.objects.get(id=site.group.id).last_polled_at == polled
    assert Run.objects.get(id=second.id).status == RunStatus.PENDING

    fake.finish(str(first.id))
    coord.step()
    assert [a.run_id for a in fake.launched] == [str(first.id), str(second.id)]


def test_a_failed_launch_is_reported_as_dispatch_failed(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    run = site.deploy({"steps": [{"name": "x", "run": "true"}]})
    fake = FakeLauncher(fail="permanent")
    coord = coordinator(site, fake)

    coord.step()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILURE
    assert run.failure_reason == "dispatch failed: fake launcher configured to fail (permanent)"
    assert not Runner.objects.filter(runner_group=site.group).exists()  # the stub is gone
    group = RunnerGroup.objects.get(id=site.group.id)
    assert group.last_dispatch_error == "fake launcher configured to fail (permanent)"
    assert fake.attempts == 1  # permanent: not retried
    assert coord.workers == {}
    assert events(caplog, "dispatch.failed")
    assert events(caplog, "poll.backoff")  # a launcher that cannot launch slows the coordinator down


def test_a_transient_launch_failure_is_retried_before_giving_up(site: Site) -> None:
    run = site.deploy({"steps": [{"name": "x", "run": "true"}]})
    fake = FakeLauncher()
    fake.fail_next("docker busy", permanent=False, times=2)
    coord = coordinator(site, fake, launch_attempts=3)

    coord.step()
    assert fake.attempts == 3
    assert list(coord.workers) == [str(run.id)]
    assert Run.objects.get(id=run.id).status == RunStatus.ASSIGNED

    other = second_stack_run(site)
    fake.fail_next("docker busy", permanent=False, times=3)
    coord.step()
    assert Run.objects.get(id=other.id).status == RunStatus.FAILURE
    assert Run.objects.get(id=other.id).failure_reason == "dispatch failed: docker busy"


def test_after_a_restart_it_reattaches_to_running_workers_and_counts_them(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    run = site.deploy({"steps": [{"name": "x", "run": "true"}]})
    world = FakeWorld()
    before = coordinator(site, FakeLauncher(world=world), max_parallel=1)
    before.step()
    del before  # the coordinator process died; its worker runs on

    second_stack_run(site)
    after = coordinator(site, FakeLauncher(world=world), max_parallel=1)
    after.reattach()
    assert list(after.workers) == [str(run.id)]
    [record] = events(caplog, "worker.reattached")
    assert record.getMessage().startswith("re-attached to fake worker ")
    after.step()  # at capacity with the re-attached worker: no new claim
    assert len(world.workers) == 1


def test_server_errors_back_off_and_never_crash_the_loop(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    coord = Coordinator(GantryClient(f"http://127.0.0.1:{closed}", "x", timeout=2), FakeLauncher(),
                        Settings(**{**QUICK.__dict__, "backoff_cap": 0.05}))  # fmt: skip
    for _ in range(4):
        coord.step()
    backoffs = events(caplog, "poll.backoff")
    assert len(backoffs) == 4
    assert [b.failures for b in backoffs] == [1, 2, 3, 4]  # type: ignore[attr-defined]
    assert all(b.seconds <= 0.05 for b in backoffs)  # type: ignore[attr-defined]
    assert all(b.status == 0 for b in backoffs)  # type: ignore[attr-defined]


def test_a_rotated_token_is_logged_and_backed_off(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    old = site.group_token
    services.runner_group_rotate_token(group=site.group)
    coord = coordinator(site, FakeLauncher(), token=old)
    coord.step()
    [refused] = events(caplog, "poll.unauthorized")
    assert "revoked" in refused.getMessage()  # which refusal, from the server's error
    assert events(caplog, "poll.backoff")[0].status == 401  # type: ignore[attr-defined]


def test_stop_cuts_off_a_parked_long_poll(site: Site) -> None:
    coord = coordinator(site, FakeLauncher(), wait=30)
    polls: list[str] = []  # how each poll ended: "answered" (a claim or a 204 at its deadline) or "cut off"
    poll = coord.client.poll

    def recorded(wait: float = 0) -> Any:
        try:
            answer = poll(wait)
        except RequestAborted:
            polls.append("cut off")
            raise
        polls.append("answered")
        return answer

    coord.client.poll = recorded  # type: ignore[method-assign]
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(coord.run()))
    thread.start()
    wait_until(lambda: RunnerGroup.objects.get(id=site.group.id).last_polled_at is not None, 30, "the first poll")
    time.sleep(0.2)  # bounded: lets the request park; the test holds either way
    coord.stop()
    thread.join(60)  # hang guard only
    assert not thread.is_alive(), "hang guard: the coordinator had not stopped 60 s after stop()"
    assert result == [0]
    assert polls == ["cut off"]  # not answered at the end of its 30 s wait: stop() cut it off


def test_its_polls_name_it_and_the_server_records_who_polls(site: Site) -> None:
    from gantry import redis as gantry_redis
    from gantry.dispatch import coordinators

    coordinators.forget_writes()
    gantry_redis.client().delete(coordinators.key_for(site.group.id))  # group ids repeat from test to test
    coord = coordinator(site, FakeLauncher())

    coord.step()  # nothing to claim: a plain 204 poll

    found = (coordinators.of_groups([site.group.id]) or {})[site.group.id]
    assert [(c.id, c.host, c.version) for c in found] == [(coord.instance_id, socket.gethostname(), protocol.VERSION)]
    # Another process on the same host is another coordinator.
    assert coordinator(site, FakeLauncher()).instance_id != coord.instance_id
