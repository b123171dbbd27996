"""Dispatch demand and queue depth: what an autoscaler and ``/metrics`` read (docs/queue.md).

*Runnable demand* of a group: the pending runs it could take now if it had
free slots — their selector matches it (the claim's rule), the org is not
throttled, the group is not drained. It leaves out what more runners cannot
fix (a lane, a runner still alive, a spent budget), so it is the number to
scale on. ``running`` counts the runs bound to the group's runners (assigned or
executing).

Everything here is a fixed handful of statements (gantry.sql.queue) whose cost
is bounded whatever the backlog:

- the groups and the selectors each serves (``queue.group_facts``);
- per selector, the pending runs no runner holds, counted over at most
  :data:`COUNT_CAP` rows of ``run_claim_order_idx``;
- per org, queued and assigned runs, each counted over at most
  :data:`COUNT_CAP` rows of ``run_waiting_idx``, and pending runs still pointing
  at a runner, counted from the (small) runner table;
- per group, the runs bound to its runners, from the runner table.

A count that reaches the cap reads as the cap: past ten thousand waiting runs
of one selector an autoscaler has nothing finer to learn, and the scrape stays
cheap at any queue size. Counts of pending runs are then sorted into reasons
by the queue's own ladder, one selector at a time.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gantry.core.errors import NotFound
from gantry.core.models import Organization, RunStatus
from gantry.dispatch import queue
from gantry.sql import queue as sql
from gantry.sql.queue import COUNT_CAP


@dataclass(frozen=True)
class SelectorBacklog:
    selector_id: int
    organization_id: int
    selector: dict[str, str]
    pending: int  # capped at COUNT_CAP


def unbound_pending(*, selector_ids: Iterable[int] | None = None) -> list[SelectorBacklog]:
    params: dict[str, Any] = {}
    statement = sql.UNBOUND_PENDING
    if selector_ids is not None:
        statement, params = sql.UNBOUND_PENDING_OF_SELECTORS, {"ids": list(selector_ids)}
    with connection.cursor() as cur:
        cur.execute(statement, params)
        return [SelectorBacklog(r[0], r[1], queue.as_json(r[2]), r[3]) for r in cur.fetchall()]


def running_by_group(*, group_id: int | None = None) -> dict[int, int]:
    statement, params = (sql.RUNNING_OF_GROUP, {"group_id": group_id}) if group_id else (sql.RUNNING_BY_GROUP, {})
    with connection.cursor() as cur:
        cur.execute(statement, params)
        return dict(cur.fetchall())


def runnable(group: queue.GroupFacts, facts: queue.OrgFacts, backlog: dict[int, int]) -> int:
    """Pending runs ``group`` could take now with free slots (0 when drained or the org is throttled)."""
    if group.drained:
        return 0
    found = sum(backlog.get(s, 0) for s in group.selector_ids)
    # The budget is asked only when there is demand to throttle (one Redis peek).
    if found and facts.budget.throttled:
        return 0
    return found


def group_demand(*, group_id: int, now: datetime) -> dict[str, int]:
    """``GET /runner-groups/demand``: {runnable, running, max_concurrent_runs} of one group (four statements)."""
    found = queue.group_facts(group_id=group_id)
    if not found:
        # Archived since its token was read (group_facts leaves archived groups out).
        raise NotFound("runner group not found")
    (group,) = found
    org = Organization.objects.only("id", "runs_per_hour_limit", "dispatch_throttled_until").get(
        id=group.organization_id
    )
    backlog = {b.selector_id: b.pending for b in unbound_pending(selector_ids=group.selector_ids)}
    facts = queue.OrgFacts(org=org, groups=[group], now=now)
    return {
        "runnable": runnable(group, facts, backlog),
        "running": running_by_group(group_id=group.id).get(group.id, 0),
        "max_concurrent_runs": group.max_concurrent_runs,
    }


# ---------------------------------------------------------------- /metrics


def _pending_reason(backlog: SelectorBacklog, facts: queue.OrgFacts) -> str:
    """The ladder's answer for a pending run of this selector that no runner holds."""
    probe = queue.WaitingRun(
        id=uuid.UUID(int=0),
        status=RunStatus.PENDING,
        stack_id=0,
        stack_name="",
        deployment_id=0,
        created_at=facts.now,
        first_pending_at=facts.now,
        selector_id=backlog.selector_id,
        selector=backlog.selector,
        runner_id=None,
        lease_expires_at=None,
        runner_status=None,
        runner_created_at=None,
        runner_last_seen=None,
        lane_holder_run_id=None,
    )
    return str(queue.reason_for(queue.Situation(run=probe, org=facts))["code"])


class QueueCollector(Collector):
    """Queue depth by reason, and per-group slots and demand, computed from the database at scrape time.

    Registered on its own registry (``gantry.metrics.SCRAPE_REGISTRY``), served
    only by ``/metrics``: reading a sample of the default registry in a test
    or a health check never runs these statements.
    """

    def collect(self) -> Iterable[Metric]:
        now = timezone.now()
        groups = queue.group_facts()
        backlogs = unbound_pending()
        running = running_by_group()
        with connection.cursor() as cur:
            cur.execute(sql.ORG_COUNTS)
            org_rows = cur.fetchall()

        waiting = GaugeMetricFamily(
            "gantry_queue_runs_waiting",
            f"Waiting runs (queued, pending, assigned) by org and reason code (docs/queue.md); each count "
            f"stops at {COUNT_CAP} per status or selector.",
            labels=["org", "reason"],
        )
        used = GaugeMetricFamily(
            "gantry_runner_group_slots_used", "Runner rows (slots) in use.", labels=["org", "group"]
        )
        free = GaugeMetricFamily(
            "gantry_runner_group_slots_free", "max_concurrent_runs - slots used.", labels=["org", "group"]
        )
        bound = GaugeMetricFamily(
            "gantry_runner_group_running",
            "Runs assigned to or executing on the group's runners.",
            labels=["org", "group"],
        )
        drained = GaugeMetricFamily(
            "gantry_runner_group_drained", "1 when the group is drained.", labels=["org", "group"]
        )
        demand = GaugeMetricFamily(
            "gantry_runner_group_runnable_demand",
            "Pending runs the group could take now if it had slots (selector matches, org not throttled, "
            "group not drained): the autoscaling signal.",
            labels=["org", "group"],
        )

        groups_by_org: defaultdict[int, list[queue.GroupFacts]] = defaultdict(list)
        for g in groups:
            groups_by_org[g.organization_id].append(g)
        backlog_by_org: defaultdict[int, list[SelectorBacklog]] = defaultdict(list)
        for b in backlogs:
            backlog_by_org[b.organization_id].append(b)

        for org_id, slug, rate, stamp, queued, assigned, pending_bound in org_rows:
            org = Organization(id=org_id, slug=slug, runs_per_hour_limit=rate, dispatch_throttled_until=stamp)
            facts = queue.OrgFacts(org=org, groups=groups_by_org[org_id], now=now)
            counts = dict.fromkeys(queue.CODES, 0)
            counts["waiting_for_lane"] = queued
            counts["runner_booting"] = assigned
            counts["previous_runner_alive"] = pending_bound
            for b in backlog_by_org[org_id]:
                counts[_pending_reason(b, facts)] += b.pending
            for code, n in counts.items():
                waiting.add_metric([slug, code], n)
            per_selector = {b.selector_id: b.pending for b in backlog_by_org[org_id]}
            for g in facts.groups:
                labels = [slug, str(g.id)]
                used.add_metric(labels, g.runner_count)
                free.add_metric(labels, g.free_slots)
                bound.add_metric(labels, running.get(g.id, 0))
                drained.add_metric(labels, int(g.drained))
                demand.add_metric(labels, runnable(g, facts, per_selector))
        return [waiting, used, free, bound, drained, demand]

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not query the database
