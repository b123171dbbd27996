"""The backend dispatcher's candidate query (docs/design.md: ListDispatchCandidates) and the per-org in-flight cap.

One statement lists a bounded batch of pending runs that github_actions
groups could take now, oldest first:

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
then one probe of ``run_claimable_idx`` per selector, taking no more than the
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

CANDIDATES_SQL = """
WITH org_load AS (
    -- In flight: every runner row of the org's github_actions groups, drained or full ones too.
    SELECT g.organization_id AS org_id, COALESCE(o.max_in_flight, %(max_per_org)s) AS cap,
           SUM(g.runner_count) AS in_flight
    FROM runner_group g JOIN organization o ON o.id = g.organization_id
    WHERE g.kind = 'github_actions'
      AND (o.dispatch_throttled_until IS NULL OR o.dispatch_throttled_until <= %(now)s)
    GROUP BY g.organization_id, o.max_in_flight
),
grp AS (
    SELECT g.id, g.organization_id, g.labels, o.default_runner_group_id,
           LEAST(l.cap - l.in_flight, g.max_concurrent_runs - g.runner_count, %(batch)s) AS take,
           l.cap - l.in_flight AS room
    FROM runner_group g
    JOIN org_load l ON l.org_id = g.organization_id
    JOIN organization o ON o.id = g.organization_id
    WHERE g.kind = 'github_actions' AND NOT g.drained AND g.runner_count < g.max_concurrent_runs
      AND l.in_flight < l.cap
),
cand AS (
    SELECT c.id, c.first_pending_at, grp.organization_id, grp.room, array_agg(grp.id ORDER BY grp.id) AS groups
    FROM grp
    JOIN run_selector s ON s.organization_id = grp.organization_id AND s.selector <@ grp.labels
        -- an empty selector goes to the org's default group, or anywhere without one
        AND (s.selector <> '{}'::jsonb OR grp.default_runner_group_id IS NULL OR grp.default_runner_group_id = grp.id)
    CROSS JOIN LATERAL (
        SELECT r.id, r.first_pending_at FROM run r
        WHERE r.organization_id = grp.organization_id AND r.selector_id = s.id
          AND r.status = 'pending' AND r.assigned_runner_id IS NULL
        ORDER BY r.first_pending_at, r.id
        LIMIT grp.take
    ) c
    GROUP BY c.id, c.first_pending_at, grp.organization_id, grp.room
),
ranked AS (
    SELECT cand.*, row_number() OVER (PARTITION BY organization_id ORDER BY first_pending_at, id) AS n FROM cand
)
SELECT id, organization_id, groups, first_pending_at FROM ranked
WHERE n <= room
ORDER BY first_pending_at, id
LIMIT %(batch)s
"""

# An org's cap and in-flight count (re-read under the dispatcher's org lock:
# another dispatcher may have dispatched for it since the candidate query).
IN_FLIGHT_SQL = """
SELECT COALESCE(o.max_in_flight, %(max_per_org)s), COALESCE(SUM(g.runner_count), 0)
FROM organization o LEFT JOIN runner_group g ON g.organization_id = o.id AND g.kind = 'github_actions'
WHERE o.id = %(org_id)s
GROUP BY o.id, o.max_in_flight
"""


@dataclass(frozen=True)
class Candidate:
    run_id: uuid.UUID
    organization_id: int
    group_ids: tuple[int, ...]  # the groups that can take it, lowest id first
    first_pending_at: datetime


def list_candidates(*, now: datetime, limit: int) -> list[Candidate]:
    """The tick's candidates: at most ``limit``, oldest first, each org within its room."""
    params: dict[str, Any] = {"now": now, "batch": limit, "max_per_org": conf.get().dispatch_max_per_org}
    with connection.cursor() as cur:
        cur.execute(CANDIDATES_SQL, params)
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
        cur.execute(IN_FLIGHT_SQL, {"org_id": organization_id, "max_per_org": cap_default})
        row = cur.fetchone()
    if row is None:
        return InFlight(count=0, cap=cap_default)
    return InFlight(count=int(row[1]), cap=int(row[0]))


# Session-level advisory locks, one per org, so two dispatchers never dispatch
# for the same org at once (which could take it past its cap): the first takes
# the org, the second moves on to other orgs. (classid, objid) form, with a
# constant class so Gantry's locks never collide with anyone else's.
LOCK_CLASS = 0x6A17


def try_lock_org(organization_id: int) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, organization_id])
        row = cur.fetchone()
    return bool(row and row[0])


def unlock_org(organization_id: int) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, organization_id])
