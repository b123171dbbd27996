"""The chaos run as data: which deployments are queued when, and which faults strike when, from one seed.

``plan(seed)`` is a pure function: the same seed gives the same plan, so a
failing run is repeated with ``GANTRY_CHAOS_SEED=<seed>``. (What the faults
hit — which runner is running at that instant — still depends on timing.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Each kind of fault, and how many times one run injects it.
FAULT_COUNTS: dict[str, int] = {
    "runner_kill": 8,  # SIGKILL an ephemeral runner while its run executes
    "coordinator_kill": 3,  # SIGKILL the coordinator; started again `pause` seconds later
    "redis_restart": 2,  # SIGKILL redis-server; an empty one on the same port 2.5 s later
    "postgres_restart": 2,  # pg_ctl stop -m fast, then start
    "gunicorn_worker_kill": 3,  # SIGKILL one gunicorn worker; the master forks a new one
}
KINDS = tuple(FAULT_COUNTS)

# The workload: stacks that get one deployment, and "lanes": stacks that get
# several deployments at once, queued behind each other on the stack's lane.
SINGLE_STACKS = 40
LANE_STACKS = 12
LANE_DEPTH = 10
# Deployments are queued, and faults injected, over this many seconds from the start.
WINDOW = 60.0
# Faults keep at least this far apart, so each one's recovery can be seen on its own.
FAULT_SPACING = 2.5


@dataclass(frozen=True)
class Submit:
    at: float
    stack: str  # the stack's name; the harness creates every stack first
    count: int  # deployments queued at once on that stack


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    pause: float = 0.0  # seconds until the killed process is started again (0: it is not)
    target: str = ""  # the supervisor's name of the process to hit, for kinds that name one


@dataclass(frozen=True)
class Plan:
    seed: int
    stacks: tuple[str, ...]
    submits: tuple[Submit, ...]
    faults: tuple[Fault, ...]

    @property
    def deployments(self) -> int:
        return sum(s.count for s in self.submits)


def plan(seed: int) -> Plan:
    rng = random.Random(seed)
    singles = [f"single-{i:02d}" for i in range(SINGLE_STACKS)]
    lanes = [f"lane-{i:02d}" for i in range(LANE_STACKS)]
    submits = [Submit(round(rng.uniform(0, WINDOW), 2), name, 1) for name in singles]
    # Lanes fill in the first two thirds, so their queues drain while faults still strike.
    submits += [Submit(round(rng.uniform(0, WINDOW * 2 / 3), 2), name, LANE_DEPTH) for name in lanes]

    kinds = [kind for kind, count in FAULT_COUNTS.items() for _ in range(count)]
    rng.shuffle(kinds)
    # Evenly spread slots with jitter, from 3 s in (work is under way) to the window's end.
    slot = (WINDOW - 3.0) / len(kinds)
    times = [round(3.0 + i * slot + rng.uniform(0, max(0.0, slot - FAULT_SPACING)), 2) for i in range(len(kinds))]
    faults = []
    for i, (at, kind) in enumerate(zip(times, kinds, strict=True)):
        pause = 0.0
        if kind == "coordinator_kill":
            # Back before the next fault, so a second coordinator_kill always finds one to kill.
            gap = (times[i + 1] if i + 1 < len(times) else WINDOW + 10) - at
            pause = round(min(rng.uniform(0.5, 4.0), max(0.3, gap - 1.0)), 2)
        faults.append(Fault(at, kind, pause))
    return Plan(
        seed=seed,
        stacks=tuple(singles + lanes),
        submits=tuple(sorted(submits, key=lambda s: s.at)),
        faults=tuple(faults),
    )
