"""Why a waiting run is not running yet: the queue's reason ladder (docs/queue.md).

Every queued, pending and assigned run of an org gets exactly one reason, the
first rung of :data:`LADDER` that applies to it. The rungs are plain functions
of a :class:`Situation` (the run, the org's runner groups that could take it,
the org's dispatch budget); a new reason is one function and one line in
``LADDER``, in its place in the order, and nothing else changes.

The read is set-based, a fixed handful of statements whatever the backlog:

1. the page of waiting runs (``gantry.sql.queue.WAITING_PAGE``): one range of
   ``run_waiting_idx`` per status, merged in (created_at, id) order and cut at
   the page's end, then joined with the stack, the selector, the runner a run
   points at, and a queued run's lane holder (a probe of the one-lane-holder
   unique index);
2. the org's runner groups, each with the org's selectors it serves
   (``gantry.sql.queue.groups``), matched in SQL by the claim's own rule
   (``selector <@ labels``; an empty selector only to the default group when
   the org has one);
3. at most one peek at the org's token bucket (``throttle.budget``, Redis),
   made only when some run reaches the ``org_throttled`` rung.

The claim (``gantry.dispatch.claim``) and this module write the matching rule
separately; the two must stay in step, and the tests build each reason for
real and check the claim agrees (a ``dispatchable`` run is the one the next
poll takes, a ``no_matching_group`` one is never claimed).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from django.db import connection

from gantry import conf
from gantry.core import params, words
from gantry.core.errors import InvalidRequest
from gantry.core.models import RUNNER_NOT_ACCEPTED, GroupKind, Organization, Priority, RunStatus
from gantry.dispatch import throttle
from gantry.dispatch.candidates import InFlight, org_in_flight
from gantry.sql import queue as sql

PAGE_DEFAULT = 100
PAGE_MAX = 500

# ---------------------------------------------------------------- facts


@dataclass(frozen=True)
class GroupFacts:
    """A runner group as the ladder sees it."""

    id: int
    organization_id: int
    name: str
    kind: str
    labels: dict[str, str]
    max_concurrent_runs: int
    runner_count: int
    drained: bool
    last_polled_at: datetime | None
    last_dispatch_error: str
    last_dispatch_error_at: datetime | None
    # The org's selectors (run_selector ids) this group serves, by the claim's rule.
    selector_ids: frozenset[int]

    @property
    def free_slots(self) -> int:
        return max(0, self.max_concurrent_runs - self.runner_count)

    def polled_since(self, since: datetime) -> bool:
        return self.last_polled_at is not None and self.last_polled_at >= since


@dataclass(frozen=True)
class WaitingRun:
    id: uuid.UUID
    status: str
    stack_id: int
    stack_name: str
    deployment_id: int
    created_at: datetime
    first_pending_at: datetime | None
    selector_id: int
    selector: dict[str, str]
    runner_id: uuid.UUID | None
    lease_expires_at: datetime | None
    # The runner a run points at (only while that row exists: the FK nulls the pointer).
    runner_status: str | None
    runner_created_at: datetime | None
    runner_last_seen: datetime | None
    lane_holder_run_id: uuid.UUID | None
    priority: int = Priority.NORMAL


@dataclass
class OrgFacts:
    """What the ladder needs of the org, read once per request (the budget only if a rung asks)."""

    org: Organization
    groups: list[GroupFacts]
    now: datetime
    stale_after: int = field(default_factory=lambda: conf.get().poll_stale_after)

    @cached_property
    def budget(self) -> throttle.Budget:
        return throttle.budget(
            organization_id=self.org.id,
            rate=self.org.runs_per_hour_limit,
            stamp=self.org.dispatch_throttled_until,
            now=self.now,
        )

    @cached_property
    def in_flight(self) -> InFlight:
        """The org's github_actions runners and its cap (one statement, only if a rung asks)."""
        return org_in_flight(self.org.id)

    def matching(self, selector_id: int) -> list[GroupFacts]:
        return [g for g in self.groups if selector_id in g.selector_ids]


@dataclass(frozen=True)
class Situation:
    """One run and what could take it: the argument of every rung."""

    run: WaitingRun
    org: OrgFacts

    @cached_property
    def matching(self) -> list[GroupFacts]:
        return self.org.matching(self.run.selector_id)

    @cached_property
    def undrained(self) -> list[GroupFacts]:
        return [g for g in self.matching if not g.drained]

    @cached_property
    def with_free_slots(self) -> list[GroupFacts]:
        return [g for g in self.undrained if g.free_slots > 0]

    @property
    def poll_cutoff(self) -> datetime:
        return self.org.now - timedelta(seconds=self.org.stale_after)


Reason = dict[str, Any]
Rung = Callable[[Situation], Reason | None]


def as_json(value: Any) -> Any:
    """A jsonb column read by a raw cursor (Django's psycopg setup hands jsonb over as text)."""
    return json.loads(value) if isinstance(value, str) else value


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat() if at is not None else None


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _names(groups: Sequence[GroupFacts]) -> str:
    return ", ".join(g.name for g in groups)


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


# ---------------------------------------------------------------- the rungs, in ladder order


def waiting_for_lane(s: Situation) -> Reason | None:
    if s.run.status != RunStatus.QUEUED:
        return None
    holder = s.run.lane_holder_run_id
    detail = (
        f"Queued behind run {holder}: stack {s.run.stack_name} runs one deployment at a time."
        if holder
        else f"Queued on stack {s.run.stack_name}; it becomes pending as the stack's lane frees."
    )
    return {"detail": detail, "lane_holder_run_id": str(holder) if holder else None}


def runner_booting(s: Situation) -> Reason | None:
    if s.run.status != RunStatus.ASSIGNED:
        return None
    lease = s.run.lease_expires_at
    detail = f"Runner {s.run.runner_id} holds the lease and is starting"
    detail += f"; it must accept by {_when(lease)}." if lease else "."
    return {"detail": detail, "runner_id": str(s.run.runner_id), "lease_expires_at": _iso(lease)}


def reaped_after(run: WaitingRun) -> datetime | None:
    """When the inactive-runner reaper may delete the runner ``run`` points at (its next sweep after this)."""
    cfg = conf.get()
    if run.runner_status in RUNNER_NOT_ACCEPTED and run.runner_created_at:
        # A stub (never accepted) ages from its creation (reapers.inactive_runners).
        return run.runner_created_at + timedelta(seconds=cfg.stub_cutoff)
    seen = run.runner_last_seen or run.runner_created_at
    return seen + timedelta(seconds=cfg.runner_execution_timeout) if seen else None


def previous_runner_alive(s: Situation) -> Reason | None:
    if s.run.status != RunStatus.PENDING or s.run.runner_id is None:
        return None
    after = reaped_after(s.run)
    detail = (
        f"Its lease lapsed, but runner {s.run.runner_id}, sent for it earlier, still exists; to never run it "
        f"twice it is kept out of dispatch until that runner deregisters or is reaped"
    )
    detail += f" (after {_when(after)})." if after else "."
    return {"detail": detail, "runner_id": str(s.run.runner_id), "reaped_after": _iso(after)}


def _missing(selector: dict[str, str], labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in selector.items() if labels.get(k) != v}


def no_matching_group(s: Situation) -> Reason | None:
    if s.matching:
        return None
    groups = s.org.groups
    if not groups:
        return {"detail": "This org has no runner group.", "closest_group_id": None, "missing_labels": {}}
    selector = s.run.selector
    if not selector:
        # An empty selector goes only to the default group; it matched none, so the default is gone.
        return {
            "detail": "The run selects no labels, so only the org's default runner group may take it, "
            "and that group is not there.",
            "closest_group_id": None,
            "missing_labels": {},
        }
    closest = min(groups, key=lambda g: (len(_missing(selector, g.labels)), g.name))
    missing = _missing(selector, closest.labels)
    return {
        "detail": f"No runner group has the labels {_labels(selector)}; the closest, {closest.name}, "
        f"lacks {_labels(missing)}.",
        "closest_group_id": closest.id,
        "missing_labels": missing,
    }


def groups_drained(s: Situation) -> Reason | None:
    if s.undrained:
        return None
    return {
        "detail": f"Every runner group that can take it is drained: {_names(s.matching)}.",
        "group_ids": [g.id for g in s.matching],
    }


def org_throttled(s: Situation) -> Reason | None:
    budget = s.org.budget
    if not budget.throttled:
        return None
    until = budget.next_slot_at
    if until is None:
        detail = "The org's dispatch rate is 0 runs per hour: nothing dispatches until a super-admin raises it."
    else:
        detail = (
            f"The org's dispatch budget ({words.plural(budget.runs_per_hour_limit, 'run')} per hour) is spent; "
            f"the next run may go at {_when(until)} (in {words.duration(budget.seconds_to_next_slot)})."
        )
    return {"detail": detail, "until": _iso(until)}


def org_in_flight_cap(s: Situation) -> Reason | None:
    # The backend dispatcher serves github_actions groups only up to the org's
    # in-flight cap; a self-hosted group among the matching ones is not held by it.
    if not s.undrained or any(g.kind != GroupKind.GITHUB_ACTIONS for g in s.undrained):
        return None
    flight = s.org.in_flight
    if flight.count < flight.cap:
        return None
    return {
        "detail": f"The org has {words.plural(flight.count, 'run')} in flight on its GitHub Actions groups, its cap "
        f"({flight.cap}: max_in_flight, else GANTRY_DISPATCH_MAX_PER_ORG); the next goes when one ends.",
        "in_flight": flight.count,
        "cap": flight.cap,
        "group_ids": [g.id for g in s.undrained],
    }


def groups_at_capacity(s: Situation) -> Reason | None:
    if s.with_free_slots:
        return None
    used = ", ".join(f"{g.name} {g.runner_count}/{g.max_concurrent_runs}" for g in s.undrained)
    return {
        "detail": f"Every runner group that can take it has all its slots taken: {used}.",
        "group_ids": [g.id for g in s.undrained],
    }


def no_runner_polling(s: Situation) -> Reason | None:
    groups = s.with_free_slots
    if any(g.polled_since(s.poll_cutoff) for g in groups):
        return None
    polls = [g.last_polled_at for g in groups if g.last_polled_at is not None]
    last = max(polls) if polls else None
    seen = f"last poll {_when(last)}" if last else "never polled"
    return {
        "detail": f"{_names(groups)} {'has' if len(groups) == 1 else 'have'} free slots, but no coordinator "
        f"polled in the last {words.duration(s.org.stale_after)} ({seen}): is it running?",
        "group_ids": [g.id for g in groups],
        "last_polled_at": _iso(last),
    }


def dispatchable(s: Situation) -> Reason | None:
    groups = [g for g in s.with_free_slots if g.polled_since(s.poll_cutoff)]
    return {
        "detail": f"Nothing holds it back: the next poll of {_names(groups)} takes it (oldest first).",
        "group_ids": [g.id for g in groups],
    }


# The ladder: the first rung that applies decides. A new reason goes in here, in its place.
LADDER: list[tuple[str, Rung]] = [
    ("waiting_for_lane", waiting_for_lane),
    ("runner_booting", runner_booting),
    ("previous_runner_alive", previous_runner_alive),
    ("no_matching_group", no_matching_group),
    ("groups_drained", groups_drained),
    ("org_throttled", org_throttled),
    ("org_in_flight_cap", org_in_flight_cap),
    ("groups_at_capacity", groups_at_capacity),
    ("no_runner_polling", no_runner_polling),
    ("dispatchable", dispatchable),
]
CODES: tuple[str, ...] = tuple(code for code, _ in LADDER)


def reason_for(situation: Situation) -> Reason:
    """The first rung that applies: ``{code, detail, ...}``. The last rung always applies."""
    for code, rung in LADDER:
        found = rung(situation)
        if found is not None:
            return {"code": code, **found}
    raise AssertionError("the ladder's last rung always applies")  # pragma: no cover


def group_facts(*, organization_id: int | None = None, group_id: int | None = None) -> list[GroupFacts]:
    """Runner groups with the selectors each serves: one statement (all orgs when no filter is given)."""
    params = {}
    if organization_id is not None:
        params["org_id"] = organization_id
    if group_id is not None:
        params["group_id"] = group_id
    with connection.cursor() as cur:
        cur.execute(sql.groups(*params), params)
        rows = cur.fetchall()
    return [
        GroupFacts(
            id=r[0],
            organization_id=r[1],
            name=r[2],
            kind=r[3],
            labels=as_json(r[4]),
            max_concurrent_runs=r[5],
            runner_count=r[6],
            drained=r[7],
            last_polled_at=r[8],
            last_dispatch_error=r[9],
            last_dispatch_error_at=r[10],
            selector_ids=frozenset(r[11]),
        )
        for r in rows
    ]


# ---------------------------------------------------------------- cursors


_BEFORE_ALL = (datetime(1, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


def encode_cursor(created_at: datetime, run_id: uuid.UUID) -> str:
    raw = json.dumps([created_at.astimezone(UTC).isoformat(), str(run_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


CURSOR_MAX = 256  # an encoded cursor is about 100 characters; anything much longer is not one of ours


def decode_cursor(cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    """The (created_at, id) a page continues after; 400 for anything this module did not write.

    The shape is checked, not trusted: a JSON list of exactly two strings, an
    aware ISO time and a UUID, in at most ``CURSOR_MAX`` characters (so no deep
    nesting reaches the JSON parser's recursion). The time is converted to
    UTC here: PostgreSQL refuses offsets past +/-15:59 ("+23:59"), and a time
    that leaves the calendar once converted is refused, not passed on.
    """
    if not cursor:
        return None
    try:
        if len(cursor) > CURSOR_MAX:
            raise ValueError("too long")
        decoded = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(decoded, list) or len(decoded) != 2:
            raise ValueError("not a pair")
        at, run_id = decoded
        if not isinstance(at, str) or not isinstance(run_id, str):
            raise ValueError("not two strings")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError("naive time")
        return when.astimezone(UTC), uuid.UUID(run_id)
    except (ValueError, TypeError, OverflowError, RecursionError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("cursor is not one this API handed out", field="cursor") from None


def page_limit(raw: str | None, *, default: int = PAGE_DEFAULT, maximum: int = PAGE_MAX) -> int:
    """The ``limit`` query parameter: absent or empty is the default; else 1 to ``maximum`` in ASCII digits (400)."""
    if raw in (None, ""):
        return default
    return params.whole_number(raw, name="limit", minimum=1, maximum=maximum)


# ---------------------------------------------------------------- the read


@dataclass(frozen=True)
class QueueEntry:
    run: WaitingRun
    reason: Reason
    waiting_seconds: int
    # The issue-25 contract (docs/briefs common.md): slice A computes these; defaulted here so the pages can be
    # written against them before that merge. A None position/estimate means "not known", never a guess.
    position: int | None = None
    position_group_id: int | None = None
    position_group_name: str | None = None
    expected_start_seconds: int | None = None
    effective_priority: int = Priority.NORMAL


@dataclass(frozen=True)
class QueuePage:
    entries: list[QueueEntry]
    next_cursor: str | None
    org: OrgFacts


def waiting_runs(*, organization_id: int, after: tuple[datetime, uuid.UUID] | None, limit: int) -> list[WaitingRun]:
    after_at, after_id = after or _BEFORE_ALL
    params = {"org_id": organization_id, "after_at": after_at, "after_id": after_id, "limit": limit}
    return _read_waiting(sql.WAITING_PAGE, params)


def _read_waiting(statement: str, params: dict[str, Any]) -> list[WaitingRun]:
    with connection.cursor() as cur:
        cur.execute(statement, params)
        rows = cur.fetchall()
    return [
        WaitingRun(
            id=r[0],
            status=r[1],
            stack_id=r[2],
            stack_name=r[3],
            deployment_id=r[4],
            created_at=r[5],
            first_pending_at=r[6],
            selector_id=r[7],
            selector=as_json(r[8]),
            runner_id=r[9],
            lease_expires_at=r[10],
            runner_status=r[11],
            runner_created_at=r[12],
            runner_last_seen=r[13],
            lane_holder_run_id=r[14],
            priority=r[15],
        )
        for r in rows
    ]


def read_queue(*, org: Organization, now: datetime, cursor: str | None = None, limit: int = PAGE_DEFAULT) -> QueuePage:
    """A page of the org's waiting runs, oldest first, each with its reason (two statements, one Redis peek)."""
    runs = waiting_runs(organization_id=org.id, after=decode_cursor(cursor), limit=limit)
    facts = OrgFacts(org=org, groups=group_facts(organization_id=org.id), now=now)
    entries = [
        QueueEntry(
            run=run,
            reason=reason_for(Situation(run=run, org=facts)),
            waiting_seconds=max(0, int((now - run.created_at).total_seconds())),
        )
        for run in runs
    ]
    last = runs[-1] if len(runs) == limit else None
    return QueuePage(entries=entries, next_cursor=encode_cursor(last.created_at, last.id) if last else None, org=facts)


def reasons_of_runs(*, org: Organization, run_ids: Sequence[uuid.UUID], now: datetime) -> dict[uuid.UUID, Reason]:
    """The reasons of some of the org's runs (those still waiting): two statements, however many."""
    runs = _read_waiting(sql.WAITING_RUNS, {"run_ids": list(run_ids)})
    if not runs:
        return {}
    facts = OrgFacts(org=org, groups=group_facts(organization_id=org.id), now=now)
    return {run.id: reason_for(Situation(run=run, org=facts)) for run in runs if run.id in set(run_ids)}


def reason_of_run(*, org: Organization, run_id: uuid.UUID, now: datetime) -> Reason | None:
    """One run's reason (its page), or None when it is not waiting."""
    return reasons_of_runs(org=org, run_ids=[run_id], now=now).get(run_id)


# STUB (slice B, until slice A's entry_of_run merges): the run's entry with its reason only; the position fields
# keep their defaults. Slice A's version replaces this whole function.
def entry_of_run(*, org: Organization, run_id: uuid.UUID, now: datetime) -> QueueEntry | None:
    """One run's queue entry (its page), or None when it is not waiting."""
    runs = [r for r in _read_waiting(sql.WAITING_RUNS, {"run_ids": [run_id]}) if r.id == run_id]
    if not runs:
        return None
    run = runs[0]
    facts = OrgFacts(org=org, groups=group_facts(organization_id=org.id), now=now)
    return QueueEntry(
        run=run,
        reason=reason_for(Situation(run=run, org=facts)),
        waiting_seconds=max(0, int((now - run.created_at).total_seconds())),
        effective_priority=run.priority,
    )
