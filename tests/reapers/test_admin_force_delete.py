"""The admin's force-delete action on runners: the same service, refusals reported per runner."""

from __future__ import annotations

import re
from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from gantry.core import services
from gantry.core.models import Runner, RunnerGroup, RunStatus, Stack
from tests.admin.helpers import messages_of, url

from .helpers import accepted, reload


def _session(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _force_delete(client: Client, *runner_ids: object) -> list[str]:
    body = {"action": "force_delete", "_selected_action": [str(pk) for pk in runner_ids], "index": "0"}
    response = client.post(url("runner"), body, follow=True)
    assert response.status_code == 200
    return messages_of(response)


def test_it_force_deletes_offline_runners_and_names_each_refusal(owner: User, stack: Stack, group: RunnerGroup) -> None:
    now = timezone.now()
    lost_run, lost = accepted(stack, group, now - timedelta(minutes=30))
    other = services.stack_create(org=stack.organization, name="other", labels=stack.labels, spec=stack.spec)
    live_run, live = accepted(other, group, now - timedelta(seconds=30))

    messages = _force_delete(_session(owner), lost, live)

    assert reload(lost_run).status == RunStatus.FAILURE
    assert not Runner.objects.filter(id=lost).exists()
    assert reload(live_run).status == RunStatus.RUNNING  # the refusal did not stop the other
    assert Runner.objects.filter(id=live).exists()
    assert "Force-deleted 1 runner(s)." in messages
    refusal = next(m for m in messages if str(live) in m)
    assert refusal.startswith(f"Runner {live}: runner was last seen at ")
    # The time to the second, as a person reads it: no microseconds.
    assert re.search(r"last seen at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC;", refusal), refusal
    assert "GANTRY_RUNNER_FORCE_GATE" in refusal


def test_it_cannot_reach_another_orgs_runner(outsider: User, stack: Stack, group: RunnerGroup) -> None:
    run, runner_id = accepted(stack, group, timezone.now() - timedelta(minutes=30))

    _force_delete(_session(outsider), runner_id)

    assert Runner.objects.filter(id=runner_id).exists()
    assert reload(run).status == RunStatus.RUNNING
