"""The backend dispatcher's candidate query (docs/design.md: ListDispatchCandidates) and the per-org in-flight cap.

One statement lists a bounded batch of pending runs that github_actions
groups could take now, in the claim's order (priority, aged, then oldest):

- orgs whose ``dispatch_throttled_until`` is in the future are skipped whole
  (the throttle's deferral: a throttled run rolls back to pending and frees
  nothing, so without this it would be a candidate every tick);
- orgs at their in-flight cap are skipped, and every other org contributes at
  most its remaining room (cap - in flight). The cap is
  ``Organization.max_in_flight``, else ``GANTRY_DISPATCH_MAX_PER_ORG``; in
  flight means the org's github_actions runner rows (each claim's stub until
  its runner deregisters or is reaped), read from the groups'
  ``runner_count``. So an org with a thousand queued runs fills its cap and
  leaves the rest of the batch to its peers: heavy org waits, others don't;
- drained groups and groups at ``max_concurrent_runs`` serve nothing;
- runs whose ``assigned_runner_id`` is set (a runner that may still boot) are
  not candidates: the same ``assigned_runner_id IS NULL`` the claim uses
  (docs/decisions.md, 1), read through the same partial index.

The runs are found the claim's way, never by scanning the backlog: per
servable group, its org's distinct selectors contained in the group's labels,
then one probe of ``run_claim_order_idx`` per selector and priority, taking no more than the
org's room. Each candidate carries the groups that can take it; the
dispatcher then claims through ``claim.claim`` (which re-checks everything
under its locks), so a candidate that went stale costs one empty claim.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from gantry import conf
from gantry.sql import dispatcher as sql


@dataclass(frozen=True)
class Candidate:
    run_id: uuid.UUID
    organization_id: int
    group_ids: tuple[int, ...]  # the groups that can take it, lowest id first
    first_pending_at: datetime


def list_candidates(*, now: datetime, limit: int) -> list[Candidate]:
    """The tick's candidates: at most ``limit``, in the claim's order, each org within its room."""
    cfg = conf.get()
    params: dict[str, Any] = {"now": now, "batch": limit, "max_per_org": cfg.dispatch_max_per_org,
                              "aging": cfg.priority_aging_seconds}  # fmt: skip
    with connection.cursor() as cur:
        cur.execute(sql.CANDIDATES, params)
        rows = cur.fetchall()
    return [Candidate(row[0], row[1], tuple(row[2]), row[3]) for row in rows]


@dataclass(frozen=True)
class InFlight:
    """An org's backend-dispatched runs in flight and its cap (the queue page's ``org_in_flight_cap``)."""

    count: int
    cap: int

    @property
    def at_cap(self) -> bool:
        return self.count >= self.cap

    @property
    def room(self) -> int:
        return max(0, self.cap - self.count)


def org_in_flight(organization_id: int) -> InFlight:
    """How many github_actions runners the org has (every runner row of its github_actions groups), and its cap."""
    cap_default = conf.get().dispatch_max_per_org
    with connection.cursor() as cur:
        cur.execute(sql.IN_FLIGHT, {"org_id": organization_id, "max_per_org": cap_default})
        row = cur.fetchone()
    if row is None:
        return InFlight(count=0, cap=cap_default)
    return InFlight(count=int(row[1]), cap=int(row[0]))


def try_lock_org(organization_id: int) -> bool:
    """Take the org's dispatcher lock (``gantry.sql.dispatcher.TRY_LOCK_ORG``) unless another session holds it."""
    with connection.cursor() as cur:
        cur.execute(sql.TRY_LOCK_ORG, [sql.LOCK_CLASS, organization_id])
        row = cur.fetchone()
    return bool(row and row[0])


def unlock_org(organization_id: int) -> None:
    with connection.cursor() as cur:
        cur.execute(sql.UNLOCK_ORG, [sql.LOCK_CLASS, organization_id])
