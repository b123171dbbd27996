"""``manage.py reap [--only NAME] [--now ISO-8601]``."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from gantry.core.models import RunnerGroup, RunStatus, Stack

from .helpers import T0, after, claim_at, deploy, reload


def reap(*args: str) -> list[str]:
    out = io.StringIO()
    call_command("reap", *args, stdout=out)
    return out.getvalue().splitlines()


def test_it_runs_every_reaper_as_of_now_and_says_what_it_did(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    claim_at(group, T0)
    when = after(T0, "assignment_ttl", 1)

    lines = reap("--now", when.isoformat())

    assert lines[0] == f"reaping as of {when.isoformat()}"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "expired_assignments",
        "inactive_runners",
        "startup_deadline",
        "cancellation_backstop",
        "retention",
    ]
    assert lines[1].startswith("expired_assignments: reset=1 skipped=0 in ")
    assert reload(run).status == RunStatus.PENDING


def test_it_runs_only_the_named_reapers(stack: Stack, group: RunnerGroup) -> None:
    run = deploy(stack, now=T0)
    claim_at(group, T0)
    when = after(T0, "assignment_ttl", 1).isoformat()

    lines = reap("--only", "startup_deadline", "--only", "cancellation_backstop", "--now", when)

    assert [line.split(":")[0] for line in lines[1:]] == ["startup_deadline", "cancellation_backstop"]
    assert reload(run).status == RunStatus.ASSIGNED


def test_it_takes_a_time_without_an_offset_as_utc(stack: Stack) -> None:
    deploy(stack, now=T0)
    lines = reap("--only", "startup_deadline", "--now", "2030-01-01T12:31:00")
    assert lines[0] == "reaping as of 2030-01-01T12:31:00+00:00"
    assert "timed_out=1" in lines[1]


def test_it_refuses_an_unknown_reaper() -> None:
    with pytest.raises(CommandError, match=r"unknown reaper 'startup'; choose from: expired_assignments, "):
        reap("--only", "startup")


def test_it_refuses_a_malformed_instant(db: None) -> None:
    with pytest.raises(CommandError, match=r"--now 'tomorrow' is not an ISO-8601 date and time"):
        reap("--now", "tomorrow")
