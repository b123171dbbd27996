"""High availability: RUNS runs through a two-of-everything cluster while one process of each kind is SIGKILLed.

One cluster run (the module fixture, about two minutes on two cores; ``cluster.py``)
boots two web processes behind haproxy, two Celery workers each with beat,
two backend dispatchers and two coordinators; queues the runs through the
balancer; kills (SIGKILL, the whole process group) and restarts a web
process, a worker and a dispatcher, then the other replica of each; waits
until every run is terminal and reads everything back. Each test below
judges one property; the counts are printed at the end of pytest's output
(``ha: …``). See docs/high-availability.md.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from tests.chaos.driver import TERMINAL
from tests.chaos.test_chaos import TRACEBACK, broken_logs, lost_runs, outcome_of, undocumented_failures
from tests.figures import add_figures
from tests.ha import cluster
from tests.ha.balancer import haproxy_binary
from tests.ha.cluster import BACKOFF_BOUND, KINDS, ClusterOutcome, cut_by_a_kill, in_flight_at_kills, polls_cut

pytestmark = pytest.mark.ha


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> ClusterOutcome:
    if haproxy_binary() is None:
        # As the docker marker does: a missing tool is a skip with its reason, and a failure under CI.
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail("CI needs haproxy for the HA test (`.ci/apt-ensure` installs it)", pytrace=False)
        pytest.skip("needs haproxy (Debian package `haproxy`)")
    seed = int(os.environ.get("GANTRY_HA_SEED") or random.SystemRandom().randrange(1, 2**31))
    tmp = tmp_path_factory.mktemp("ha")
    outcome = cluster.run_cluster(seed, tmp)
    add_figures(request.config, "ha", summary(outcome))
    return outcome


def summary(result: ClusterOutcome) -> list[str]:
    out = result.chaos
    kills = Counter(kill.kind for kill in result.kills)
    outcomes = Counter(outcome_of(run) for run in out.runs.values())
    twice = sum(1 for n in out.executions.values() if n > 1)
    fives = [r for r in result.requests if r.status >= 500]
    by_balancer = sum(1 for r in fives if r.by_balancer)
    per_server = Counter(r.server for r in fives if not r.by_balancer)
    cut = polls_cut(result)
    resent = sum(1 for *_, s in cut if s == 0.0)
    waits = [s for *_, s in cut if s]
    retried = sum(1 for r in result.requests if r.retries or r.redispatched)
    events = result.events
    # Whose claims were orphaned: a poll's (a self-hosted group) or a dispatcher's (gha).
    lapsed = Counter(
        str(run["runner_selector"].get("ha"))
        for run in out.runs.values()
        for event in run.get("events") or []
        if event["kind"] == "lease_expired"
    )
    return [
        f"seed={out.plan.seed} (repeat the plan with GANTRY_HA_SEED={out.plan.seed}); data in {out.tmp}",
        f"runs={len(out.runs)} (planned {out.plan.deployments}; {result.workflow_runs} GitHub workflow runs)",
        "kills: "
        + " ".join(f"{k}={kills[k]}" for k in KINDS)
        + f" (SIGKILL of the process group, restarted {cluster.RESTART_AFTER:g} s later: "
        + ", ".join(kill.target for kill in result.kills)
        + ")",
        "outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
        f"executed twice={twice} (accepted twice in run_event={len(result.accepted_twice)}) "
        f"lost={len(lost_runs(out))} not terminal={sum(1 for r in out.runs.values() if r['status'] not in TERMINAL)}",
        f"balancer: requests={len(result.requests)} 5xx={len(fives)} (by haproxy itself={by_balancer}, "
        f"by a backend: {dict(per_server) or 0}); in flight at a killed web={in_flight_at_kills(result)}; "
        f"retried or redispatched by haproxy={retried}",
        "haproxy's counters: " + ", ".join(f"{k}={v}" for k, v in stat_counts(result).items()),
        f"polls parked on a killed web={len(cut)}: re-sent by the balancer={resent}, "
        f"re-polled by the coordinator={len(waits)} (max {max(waits, default=0):.1f}s after the kill; "
        f"bound {BACKOFF_BOUND}s)",
        f"what the kills cost: claims={events.get('assigned', 0)} for {len(out.runs)} runs, "
        f"leases lapsed and reset by a reaper={events.get('lease_expired', 0)} "
        f"(by group: {dict(lapsed) or 0}), "
        f"dispatch failed={events.get('dispatch_failed', 0)}, runner lost={events.get('runner_lost', 0)}",
        "beat ticks sent: "
        + ", ".join(f"{k}={v}" for k, v in sorted(result.beat_ticks.items()))
        + "; reaper sweeps: "
        + ", ".join(f"{k}={v:.0f}" for k, v in sorted(result.sweeps.items())),
        "seconds: "
        + ", ".join(f"{k} {v:.0f}" for k, v in out.seconds.items())
        + f", queue to all terminal {result.play_seconds:.0f}",
    ]


def stat_counts(result: ClusterOutcome) -> dict[str, int]:
    """5xx per proxy and server, retries and redispatches, from haproxy's own counters (``show stat``)."""
    counts: dict[str, int] = {}
    for row in result.stats:
        name = row.get("svname", "")
        if name == "FRONTEND":
            counts["5xx answered by the frontend"] = int(row.get("hrsp_5xx") or 0)
        elif name == "BACKEND":
            counts["retries"] = int(row.get("wretr") or 0)
            counts["redispatches"] = int(row.get("wredis") or 0)
        else:
            counts[f"5xx from {name}"] = int(row.get("hrsp_5xx") or 0)
    return counts


def test_it_ran_every_kill_on_300_runs(ha: ClusterOutcome) -> None:
    assert len(ha.chaos.runs) >= cluster.RUNS >= 300
    kinds = Counter(kill.kind for kill in ha.kills)
    assert kinds == dict.fromkeys(KINDS, 2)
    assert ha.workflow_runs > 0, "no run went through the dispatchers"


def test_every_run_is_terminal_and_none_lost(ha: ClusterOutcome) -> None:
    assert lost_runs(ha.chaos) == []


def test_no_run_executed_twice(ha: ClusterOutcome) -> None:
    twice = {run_id: n for run_id, n in ha.chaos.executions.items() if n > 1}
    unknown = set(ha.chaos.executions) - set(ha.chaos.runs)
    assert (twice, unknown, ha.accepted_twice) == ({}, set(), {})


def test_failures_are_the_kills_documented_costs_only(ha: ClusterOutcome) -> None:
    assert undocumented_failures(ha.chaos) == {}


def test_every_succeeded_run_has_its_whole_log(ha: ClusterOutcome) -> None:
    succeeded, broken = broken_logs(ha.chaos)
    assert succeeded
    assert broken == {}


def test_no_5xx_at_the_balancer_beyond_the_killed_processes_in_flight_requests(ha: ClusterOutcome) -> None:
    fives = [r for r in ha.requests if r.status >= 500]
    # The log and haproxy's own counter agree (the log is what the checks below read).
    assert stat_counts(ha)["5xx answered by the frontend"] == len(fives)
    assert len(fives) <= in_flight_at_kills(ha), fives
    # Each is a request a crash cut off (none a live backend answered, none at any other time).
    assert [r for r in fives if not (r.by_balancer and cut_by_a_kill(ha, r))] == []


def test_parked_polls_are_re_established_within_the_coordinators_backoff(ha: ClusterOutcome) -> None:
    cut = polls_cut(ha)
    # Each web kill hits parked polls: leastconn spreads both coordinators' polls over both processes.
    assert cut, "no poll was parked on a killed web process: nothing to judge"
    # The protocol's bound: a cut poll is answered at once (the connection closes), the coordinator
    # backs off at most its cap and polls again; twice the cap leaves room for two busy cores.
    late = [(kill, coordinator, s) for kill, coordinator, s in cut if s is None or s > BACKOFF_BOUND]
    assert late == []


def test_both_beats_sent_the_reapers_ticks(ha: ClusterOutcome) -> None:
    """Two beats ran at once, each sending every reaper's tick: the reapers swept in parallel all along,
    and the checks above (none executed twice, none lost) held."""
    assert set(ha.beat_ticks) == {"worker-a", "worker-b"}
    assert min(ha.beat_ticks.values()) > 0, ha.beat_ticks


@pytest.mark.parametrize("kind", ["web", "worker", "dispatcher", "coordinator", "runners"])
def test_no_traceback_in_any_process_log(ha: ClusterOutcome, kind: str) -> None:
    """A crash of one process shows up in the others' logs as a retried call or a backoff, never a traceback."""
    found = [
        f"{path.name}: {line[:300]}"
        for path in ha.chaos.process_logs[kind]
        if path.exists()
        for line in path.read_text(errors="replace").splitlines()
        if TRACEBACK in line
    ]
    assert found == []
