"""Chaos: 160 runs through real processes while a seeded schedule kills and restarts their parts.

One chaos run (the module fixture, about three minutes) plays the plan of
``schedule.py`` against the processes of ``harness.py``; each test below
judges one property of what it left. The seed is printed in the summary
(``chaos seed=…``); ``GANTRY_CHAOS_SEED=<seed>`` repeats that plan. See
docs/testing.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.chaos import driver
from tests.chaos.driver import TIMINGS, Outcome
from tests.chaos.schedule import FAULT_COUNTS, plan
from tests.figures import add_figures

pytestmark = pytest.mark.chaos

# How a run may fail under these faults, from the code and docs (docs/reapers.md,
# docs/protocol.md, docs/runners.md), never from what a run happened to show:
DOCUMENTED_FAILURES = {
    # The inactive-runner reaper's words, and the coordinator's report of a worker that died (reconcile).
    "runner lost": re.compile(r"^runner lost: runner \S+ has not polled its run's status since "),
    "runner exited": re.compile(r"^runner lost: the worker (was killed by signal \d+|exited with code -?\d+)"),
    "dispatch failed": re.compile(r"^dispatch failed: "),
    "accept response undeliverable": re.compile(r"^accept response undeliverable: "),
}
STARTUP_TIMEOUT_REASON = "no runner started the run before the startup deadline"
TRACEBACK = "Traceback (most recent call last)"


def whole_log(run_id: str) -> re.Pattern[str]:
    """The exact log of a succeeded run of driver.spec(): both steps' headers, every line, both footers."""
    lines = "".join(f"line {i} of {run_id}\n" for i in range(1, driver.LINES + 1))
    return re.compile(
        r"==> \[1/2\] mark\n==> \[1/2\] mark: exit code 0 \(\d+\.\ds\)\n"
        rf"==> \[2/2\] work\n{re.escape(lines)}==> \[2/2\] work: exit code 0 \(\d+\.\ds\)\n\Z"
    )


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Outcome:
    seed = int(os.environ.get("GANTRY_CHAOS_SEED") or random.SystemRandom().randrange(1, 2**31))
    tmp = tmp_path_factory.mktemp("chaos")
    outcome = driver.run_chaos(plan(seed), tmp)
    add_figures(request.config, "chaos", summary(outcome))
    return outcome


def summary(out: Outcome) -> list[str]:
    faults = Counter(kind for _, kind, target in out.faults if not target.startswith("skipped"))
    skipped = Counter(kind for _, kind, target in out.faults if target.startswith("skipped"))
    outcomes = Counter(outcome_of(run) for run in out.runs.values())
    twice = sum(1 for count in out.executions.values() if count > 1)
    fives = five_hundreds(out)
    return [
        f"seed={out.plan.seed} (repeat with GANTRY_CHAOS_SEED={out.plan.seed}); data in {out.tmp}",
        f"runs={len(out.runs)} (planned {out.plan.deployments}) on {len(out.plan.stacks)} stacks",
        "faults: "
        + " ".join(f"{k}={faults[k]}" for k in FAULT_COUNTS)
        + (" (skipped: " + " ".join(f"{k}={v}" for k, v in skipped.items()) + ")" if skipped else ""),
        "outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
        f"executed twice={twice} lost={len(lost_runs(out))} not terminal={len(not_terminal(out))}",
        f"5xx answers={access_log_5xx(out)}: " + ", ".join(f"{k}={len(v)}" for k, v in fives.items()),
        "tracebacks: " + ", ".join(f"{k}={len(v)}" for k, v in tracebacks(out).items()),
        "PostgreSQL down: "
        + ", ".join(f"{up - down:.1f}s" for down, up in out.pg_outages)
        + "; the first reads after: "
        + " ".join(",".join(map(str, p)) for p in out.pg_probes),
        "seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in out.seconds.items()),
    ]


def outcome_of(run: dict[str, Any]) -> str:
    if run["status"] != "failure":
        return str(run["status"])
    reason = str(run["failure_reason"] or "")
    for name, pattern in DOCUMENTED_FAILURES.items():
        if pattern.match(reason):
            return f"failure ({name})"
    return f"failure ({reason[:60]})"


def not_terminal(out: Outcome) -> list[str]:
    return [run_id for run_id, run in out.runs.items() if run["status"] not in driver.TERMINAL]


def lost_runs(out: Outcome) -> list[str]:
    """Runs the system lost track of: not terminal, or succeeded without their step having run."""
    succeeded_unexecuted = [r for r, run in out.runs.items() if run["status"] == "succeeded" and not out.executions[r]]
    return not_terminal(out) + succeeded_unexecuted


def when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def server_records(out: Outcome) -> list[dict[str, Any]]:
    """The JSON lines of the gunicorn workers' log (gunicorn's own plain lines are left out)."""
    records = []
    for path in out.process_logs.get("server", []):
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
    return records


def in_outage(out: Outcome, record: dict[str, Any]) -> bool:
    at = when(record["ts"]).timestamp()
    return any(down <= at <= up for down, up in out.pg_outages)


def five_hundreds(out: Outcome) -> dict[str, list[str]]:
    """Requests the server answered with a 5xx (Django logs each with its status and a millisecond time):
    while PostgreSQL was down, once it answered again (within a minute), or at any other time."""
    found: dict[str, list[str]] = {"while PostgreSQL was down": [], "once PostgreSQL was back": [], "other": []}
    for record in server_records(out):
        if int(record.get("status_code") or 0) < 500:
            continue
        at = when(record["ts"]).timestamp()
        what = f"{record['ts']} {record['msg']}"
        if in_outage(out, record):
            found["while PostgreSQL was down"].append(what)
        elif any(up < at <= up + 60 for _, up in out.pg_outages):
            found["once PostgreSQL was back"].append(what)
        else:
            found["other"].append(what)
    return found


def access_log_5xx(out: Outcome) -> int:
    if out.access_log is None or not out.access_log.exists():
        return 0
    return sum(1 for line in out.access_log.read_text(errors="replace").splitlines() if re.search(r" 5\d\d$", line))


# Celery logs a failed ack at CRITICAL with a traceback when its broker connection is cut
# under it (kombu's ConnectionError). The message stays unacked and Redis hands it out again;
# every task Gantry runs is a set-based sweep or an idempotent send, so a second delivery is
# harmless. Forgiven only while the chaos run's Redis was down or reconnecting (10 s after).
ACK_CUT = re.compile(r'"logger": "celery\.worker\.request", "msg": "Couldn\'t ack .*reason:network:ConnectionError')
REDIS_RECONNECT = 10.0


def ack_cut_by_redis_restart(out: Outcome, line: str) -> bool:
    """A worker's log line that is Celery's failed ack during one of the run's Redis restarts."""
    if not ACK_CUT.search(line):
        return False
    with contextlib.suppress(ValueError, KeyError):
        at = when(json.loads(line)["ts"]).timestamp()
        return any(down <= at <= up + REDIS_RECONNECT for down, up in out.redis_outages)
    return False


def tracebacks(out: Outcome) -> dict[str, list[str]]:
    """Log lines holding a traceback, by process kind. The server's are split: those of requests
    answered 5xx (judged by the 5xx checks, which forgive an outage) and all others."""
    found: dict[str, list[str]] = {"server requests": [], "server other": []}
    for record in server_records(out):
        if TRACEBACK not in str(record.get("exc") or ""):
            continue
        what = f"{record['ts']} {record.get('logger')}: {record['msg']}: {str(record['exc']).splitlines()[-1]}"
        if record.get("logger") == "django.request":
            if not in_outage(out, record):
                found["server requests"].append(what)
        else:
            found["server other"].append(what)
    for kind in ("worker", "coordinator", "runners"):
        found[kind] = [
            f"{path.name}: {line[:400]}"
            for path in out.process_logs.get(kind, [])
            if path.exists()
            for line in path.read_text(errors="replace").splitlines()
            if TRACEBACK in line and not (kind == "worker" and ack_cut_by_redis_restart(out, line))
        ]
    return found


# ---------------------------------------------------------------- the checks


def test_the_plan_ran_with_every_fault_kind(chaos: Outcome) -> None:
    assert len(chaos.runs) >= 150
    hit = Counter(kind for _, kind, target in chaos.faults if not target.startswith("skipped"))
    assert set(hit) == set(FAULT_COUNTS), chaos.faults


def test_every_run_is_terminal_within_its_deadlines(chaos: Outcome) -> None:
    assert not_terminal(chaos) == []
    # The documented windows, plus the reaper's period (twice: a sweep may just have
    # passed), plus the time PostgreSQL was down (no reaper runs then), plus 10 s for two busy cores.
    reap = timedelta(seconds=2 * TIMINGS["GANTRY_REAPER_INTERVAL"])
    slack = timedelta(seconds=10 + sum(up - down for down, up in chaos.pg_outages))
    may_start = timedelta(seconds=TIMINGS["GANTRY_RUNNER_STARTUP_DEADLINE"] + TIMINGS["GANTRY_ASSIGNMENT_TTL"])
    may_run = timedelta(seconds=driver.SPEC_TIMEOUT + TIMINGS["GANTRY_RUNNER_EXECUTION_TIMEOUT"])
    late = []
    for run_id, run in chaos.runs.items():
        pending, started, finished = run["first_pending_at"], run["started_at"], run["finished_at"]
        assert pending, run
        assert finished, run
        start_by = when(pending) + may_start + reap + slack
        if started and when(started) > start_by:
            late.append((run_id, "started", started, start_by))
        end_by = (when(started) + may_run if started else when(pending) + may_start) + reap + slack
        if when(finished) > end_by:
            late.append((run_id, "finished", finished, end_by))
    assert late == []


def test_no_run_executed_twice_and_none_lost(chaos: Outcome) -> None:
    twice = {run_id: n for run_id, n in chaos.executions.items() if n > 1}
    unknown = set(chaos.executions) - set(chaos.runs)
    assert (twice, unknown, lost_runs(chaos)) == ({}, set(), [])


def broken_logs(outcome: Outcome) -> tuple[int, dict[str, str]]:
    """How many runs succeeded, and those whose stored log is not the whole log (the fetch's error, or its tail)."""
    succeeded = [run_id for run_id, run in outcome.runs.items() if run["status"] == "succeeded"]
    broken = {
        run_id: outcome.log_errors.get(run_id) or outcome.logs.get(run_id, "")[-300:]
        for run_id in succeeded
        if not whole_log(run_id).fullmatch(outcome.logs.get(run_id, ""))
    }
    return len(succeeded), broken


def undocumented_failures(outcome: Outcome) -> dict[str, tuple[str, str]]:
    """Runs that did not succeed for a reason the faults cannot explain: (status, reason) each."""
    undocumented = {}
    for run_id, run in outcome.runs.items():
        status, reason = run["status"], str(run["failure_reason"] or "")
        if status == "succeeded":
            continue
        if status == "startup_timeout" and reason == STARTUP_TIMEOUT_REASON:
            continue
        if status == "failure" and any(p.match(reason) for p in DOCUMENTED_FAILURES.values()):
            continue
        undocumented[run_id] = (status, reason)
    return undocumented


def test_every_succeeded_run_has_its_whole_log(chaos: Outcome) -> None:
    succeeded, broken = broken_logs(chaos)
    assert succeeded
    assert broken == {}


def test_no_lane_is_stuck(chaos: Outcome) -> None:
    queued = [run_id for run_id, run in chaos.runs.items() if run["status"] == "queued"]
    assert (chaos.stuck_lanes, queued) == ([], [])


def test_failures_have_documented_reasons_only(chaos: Outcome) -> None:
    assert undocumented_failures(chaos) == {}


def test_a_lost_runners_log_says_so(chaos: Outcome) -> None:
    lost = [
        r
        for r, run in chaos.runs.items()
        if any(DOCUMENTED_FAILURES[k].match(run["failure_reason"] or "") for k in ("runner lost", "runner exited"))
    ]
    assert lost, "the runner kills lost no run: nothing to judge"
    unmarked = {
        r: chaos.logs.get(r, "")[-200:] for r in lost if not re.search(r"\[gantry: [^\n]*\]\n\Z", chaos.logs[r])
    }
    assert unmarked == {}


def test_no_5xx_once_postgresql_is_back(chaos: Outcome) -> None:
    assert [probe for probe in chaos.pg_probes if set(probe) != {200}] == []
    assert five_hundreds(chaos)["once PostgreSQL was back"] == []


def test_no_5xx_outside_a_postgresql_restart(chaos: Outcome) -> None:
    assert five_hundreds(chaos)["other"] == []


@pytest.mark.parametrize(
    "kind",
    [
        "server requests",
        "server other",
        "worker",
        "coordinator",
        "runners",
    ],
)
def test_no_traceback_in_any_process_log(chaos: Outcome, kind: str) -> None:
    assert tracebacks(chaos)[kind] == []
