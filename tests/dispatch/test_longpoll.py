"""The long poll over real HTTP (docs/design.md §5, "Long poll", "Phase 1: Poll").

Requests go to pytest-django's ``live_server`` (a threaded server in this
process) with the stdlib ``http.client``. A poll is started in a thread; the
test knows it is parked once its first claim attempt has committed (the group's
``last_polled_at`` moved) and the listener is LISTENing. The poll reads the
listener's generation before that attempt, so any notification after it wakes
the poll: the short delay after that only makes sure the request sits in its
wait, it synchronizes nothing.

What ended each wait of a parked poll is recorded (``wakes``): its org's
notification, the server's shutdown, or its own deadline; the periodic
re-check is pushed past any test, so a poll the notification failed to wake
waits out its ``wait`` and is seen to. No assertion is on how fast a poll
answers: timeouts here only stop a stuck test. The wake latency is a figure
of ``tests/bench/longpoll.py``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from gantry import conf
from gantry.core import services
from gantry.core.models import Organization, Run, Runner, RunnerGroup, RunStatus
from gantry.dispatch import longpoll
from gantry.dispatch.claim import claim
from tests.conftest import requests_in_flight, settle_live_server
from tests.dispatch.helpers import deploy, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

POLL = "/api/v1/runner-groups/poll"
# Hang guard only: far beyond any poll's own wait (at most 30 s), so a stuck test stops.
HANG_GUARD_S = 90.0


class Answer:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body


def request(base: str, path: str, *, auth: str | None = None, timeout: float = HANG_GUARD_S) -> Answer:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "localhost", parts.port, timeout=timeout)
    headers = {"Authorization": auth} if auth else {}
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    body = json.loads(raw) if raw else None
    return Answer(resp.status, body)


class BackgroundPoll:
    """One poll request running in its own thread."""

    def __init__(self, base: str, token: str, wait: float) -> None:
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(base, token, wait), daemon=True)
        self._thread.start()

    def _run(self, base: str, token: str, wait: float) -> None:
        try:
            self.answer = request(base, f"{POLL}?wait={wait:g}", auth=f"Bearer {token}")
        except BaseException as exc:  # judged by the test
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = HANG_GUARD_S) -> Answer:
        """The answer; ``timeout`` is a hang guard, never the property under test."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"hang guard: the poll had not answered after {timeout:g} s"
        assert self.error is None, self.error
        assert self.answer is not None
        return self.answer


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Bounded polling for a condition another thread or process makes true (the bound is a hang guard)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"hang guard: {timeout:g} s without {what}"
        time.sleep(0.005)


def last_polled(group: RunnerGroup) -> datetime | None:
    return RunnerGroup.objects.values_list("last_polled_at", flat=True).get(id=group.id)


def park(base: str, token: str, group: RunnerGroup, *, wait: float) -> BackgroundPoll:
    """Start a poll and return once it has made its first (empty) attempt and is waiting."""
    assert longpoll.listener().wait_ready(30), "hang guard: the listener never started LISTENing"
    before = last_polled(group)
    poll = BackgroundPoll(base, token, wait)
    wait_until(lambda: last_polled(group) != before, 30, "the poll's first claim attempt")
    time.sleep(0.05)  # bounded: lets the request reach its wait; correctness does not depend on it
    assert not poll.done, "the poll answered instead of parking"
    return poll


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ended each wait of the parked polls, in order: ``notified`` (a notification for the
    poll's org), ``reconnect`` (the listener reconnected), ``shutdown`` or ``deadline`` (the wait
    ran out). The periodic re-check is pushed past any test, so a wait ends only on one of those."""
    monkeypatch.setattr(longpoll, "RECHECK_SECONDS", 3600.0)
    ended: list[str] = []
    wait = longpoll.ClaimableListener.wait

    def recorded(self: longpoll.ClaimableListener, org_id: int, seen: tuple[int, int], timeout: float) -> bool:
        woken = wait(self, org_id, seen, timeout)
        epoch, generation = self.generation(org_id)
        if not woken:
            ended.append("deadline")
        elif epoch != seen[0]:
            ended.append("reconnect")
        elif generation != seen[1]:
            ended.append("notified")
        else:
            ended.append("shutdown")
        return woken

    monkeypatch.setattr(longpoll.ClaimableListener, "wait", recorded)
    return ended


@pytest.fixture
def shutdown_reset() -> Iterator[None]:
    """begin_shutdown() is for good in a server; stop_listener() forgets it for the next test."""
    yield
    longpoll.stop_listener()


def new_group(org: Organization, name: str = "lp", **fields: Any) -> tuple[RunnerGroup, str]:
    return services.runner_group_create(org=org, name=name, labels={"os": "linux"}, **fields)


def lapse(run: Run) -> datetime:
    """A time past the run's lease."""
    assert run.assigned_expires_at is not None
    return run.assigned_expires_at + timedelta(seconds=1)


# ---------------------------------------------------------------- waking


def test_it_wakes_a_parked_poll_when_a_deployment_is_created(
    live_server: Any, acme: Organization, wakes: list[str]
) -> None:
    group, token = new_group(acme)
    stacks = [make_stack(acme, f"s{i}", {"os": "linux"}) for i in range(10)]
    for stack in stacks:
        wakes.clear()
        poll = park(live_server.url, token, group, wait=10)
        deployment = services.deployment_create(stack=stack)
        answer = poll.result()

        assert answer.status == 200, answer.body
        run = Run.objects.get(deployment=deployment)
        assert set(answer.body) == {"run_id", "runner_id", "runner_token", "assigned_expires_at"}
        assert answer.body["run_id"] == str(run.id)
        assert run.status == RunStatus.ASSIGNED
        assert answer.body["runner_id"] == str(run.assigned_runner_id)
        assert Runner.objects.filter(id=answer.body["runner_id"], runner_group=group).exists()
        assert answer.body["runner_token"]
        assert datetime.fromisoformat(answer.body["assigned_expires_at"]) == run.assigned_expires_at
        # Woken by the deployment's notification (an earlier one may have woken it too, to park again),
        # never by its deadline: that would be the claim's last attempt, and the same 200.
        assert set(wakes) == {"notified"}, f"the poll's waits ended by {wakes}"


def test_it_wakes_a_parked_poll_when_a_deregistered_runner_releases_its_run(
    live_server: Any, acme: Organization, wakes: list[str]
) -> None:
    group, token = new_group(acme)
    run = deploy(make_stack(acme, "web", {"os": "linux"}))
    first = claim(group=group)
    assert first is not None
    run.refresh_from_db()
    later = lapse(run)
    services.run_reset_lease(run_id=run.id, now=later)
    run.refresh_from_db()
    assert (run.status, run.assigned_runner_id) == (RunStatus.PENDING, first.runner_id)

    poll = park(live_server.url, token, group, wait=10)
    services.runner_deregister(runner_id=first.runner_id, now=later)
    answer = poll.result()

    assert answer.status == 200, answer.body
    assert answer.body["run_id"] == str(run.id)
    assert answer.body["runner_id"] != str(first.runner_id)
    assert set(wakes) == {"notified"}, f"the poll's waits ended by {wakes}"


def test_it_wakes_a_poll_parked_on_a_full_group_when_a_slot_frees(
    live_server: Any, acme: Organization, wakes: list[str]
) -> None:
    group, token = new_group(acme, max_concurrent_runs=1)
    a = deploy(make_stack(acme, "a", {"os": "linux"}))
    b = deploy(make_stack(acme, "b", {"os": "linux"}))
    held = claim(group=group)
    assert held is not None
    assert held.run_id == a.id

    poll = park(live_server.url, token, group, wait=10)  # b waits: the one slot is taken
    services.dispatch_failed(group=group, run_id=a.id, runner_id=held.runner_id, error="spawn failed")
    answer = poll.result()

    assert answer.status == 200, answer.body
    assert answer.body["run_id"] == str(b.id)
    assert set(wakes) == {"notified"}, f"the poll's waits ended by {wakes}"


def test_it_does_not_hand_another_orgs_run_to_a_parked_poll(
    live_server: Any, acme: Organization, globex: Organization, wakes: list[str], shutdown_reset: None
) -> None:
    group, token = new_group(acme)
    lst = longpoll.listener()
    poll = park(live_server.url, token, group, wait=30)
    seen = lst.generation(globex.id)
    theirs = deploy(make_stack(globex, "theirs", {"os": "linux"}))
    # The notification did arrive (for globex), so the test exercises the wake path.
    wait_until(lambda: lst.generation(globex.id) != seen, 30, "globex's notification")
    assert not poll.done, "the poll answered on another org's notification"
    longpoll.begin_shutdown()  # ends the wait now, rather than at its 30 s deadline
    answer = poll.result()

    assert answer.status == 204, answer.body
    assert wakes == ["shutdown"]  # globex's notification ended no wait of acme's poll
    assert Run.objects.get(id=theirs.id).status == RunStatus.PENDING
    assert not Runner.objects.exists()


# ---------------------------------------------------------------- no work, bad input, wrong caller


def test_it_answers_204_at_once_for_wait_0_without_work(live_server: Any, acme: Organization, wakes: list[str]) -> None:
    _group, token = new_group(acme)
    answer = request(live_server.url, f"{POLL}?wait=0", auth=f"Bearer {token}")
    assert answer.status == 204
    assert answer.body is None
    assert wakes == []  # it never parked


def test_it_answers_204_at_the_deadline_for_wait_1_without_work(
    live_server: Any, acme: Organization, wakes: list[str]
) -> None:
    _group, token = new_group(acme)
    # Listening first: a listener that connects during the wait wakes it once ("reconnect").
    assert longpoll.listener().wait_ready(30), "hang guard: the listener never started LISTENing"
    answer = request(live_server.url, f"{POLL}?wait=1", auth=f"Bearer {token}")
    assert answer.status == 204
    assert wakes == ["deadline"]  # it parked, and its wait ran out
    assert not Runner.objects.exists()


@pytest.mark.parametrize("wait", ["31", "-1", "abc"])
def test_it_refuses_a_bad_wait(live_server: Any, acme: Organization, wait: str) -> None:
    assert conf.get().poll_max_wait >= 30
    _group, token = new_group(acme)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    answer = request(live_server.url, f"{POLL}?wait={wait}", auth=f"Bearer {token}")
    assert answer.status == 400
    assert answer.body["code"] == "invalid_request"
    assert not Runner.objects.exists()  # refused before any claim


def test_it_refuses_a_runner_token(live_server: Any, acme: Organization) -> None:
    group, _token = new_group(acme)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    deploy(make_stack(acme, "web2", {"os": "linux"}))
    held = claim(group=group)
    assert held is not None
    answer = request(live_server.url, f"{POLL}?wait=0", auth=f"Bearer {held.runner_token}")
    assert answer.status == 403
    assert Runner.objects.count() == 1


def test_it_refuses_a_user_token(live_server: Any, acme: Organization, owner: User) -> None:
    new_group(acme)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    key = Token.objects.create(user=owner).key
    answer = request(live_server.url, f"{POLL}?wait=0", auth=f"Token {key}")
    assert answer.status == 403
    assert not Runner.objects.exists()


def test_it_refuses_a_poll_without_a_token(live_server: Any, acme: Organization) -> None:
    new_group(acme)
    deploy(make_stack(acme, "web", {"os": "linux"}))
    answer = request(live_server.url, f"{POLL}?wait=0")
    assert answer.status == 401
    assert not Runner.objects.exists()


def test_it_answers_200_at_once_when_work_exists(live_server: Any, acme: Organization) -> None:
    _group, token = new_group(acme)
    run = deploy(make_stack(acme, "web", {"os": "linux"}))
    answer = request(live_server.url, f"{POLL}?wait=10", auth=f"Bearer {token}")
    assert answer.status == 200
    assert answer.body["run_id"] == str(run.id)


# ---------------------------------------------------------------- server shutdown


def test_a_shutdown_answers_a_parked_poll_at_once_with_204(
    live_server: Any, acme: Organization, shutdown_reset: None, wakes: list[str]
) -> None:
    group, token = new_group(acme)
    poll = park(live_server.url, token, group, wait=30)

    longpoll.begin_shutdown()
    answer = poll.result()

    assert answer.status == 204
    assert wakes == ["shutdown"]  # not its 30 s deadline: the shutdown itself ended the wait


def test_after_a_shutdown_a_poll_does_not_park_but_still_claims(
    live_server: Any, acme: Organization, shutdown_reset: None, wakes: list[str]
) -> None:
    _group, token = new_group(acme)
    longpoll.begin_shutdown()

    empty = request(live_server.url, f"{POLL}?wait=30", auth=f"Bearer {token}")
    deploy(make_stack(acme, "s", {"os": "linux"}))
    won = request(live_server.url, f"{POLL}?wait=30", auth=f"Bearer {token}")

    assert empty.status == 204
    assert wakes == []  # answered without parking for its 30 s
    assert won.status == 200  # work that is there is still handed out


def test_shutdown_on_runs_the_previous_handler_too(shutdown_reset: None) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda sig, _frame: seen.append(sig))
    try:
        longpoll.shutdown_on(signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # handled in this (main) thread before kill() returns
        assert seen == [signal.SIGUSR1]
        assert longpoll.wait_for_claim(org_id=1, wait=30, attempt=lambda: None) is None  # does not park
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ---------------------------------------------------------------- between tests


def test_a_poll_its_client_left_parked_answers_before_the_test_ends(live_server: Any, acme: Organization) -> None:
    """What tests/conftest.py's live-server teardown does: a coordinator a test
    killed leaves its poll parked in a server thread; the poll must not retry
    its claim after the test's database is gone (docs/testing.md)."""
    group, token = new_group(acme)
    poll = park(live_server.url, token, group, wait=30)
    assert requests_in_flight() == 1  # the parked poll, seen from its server thread

    settle_live_server()

    assert requests_in_flight() == 0
    assert poll.result().status == 204  # answered, not held for its 30 s (the wait is a hang guard)
    assert not longpoll.shutting_down()  # the next test's polls park again
