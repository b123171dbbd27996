"""The backend dispatcher's SQL (gantry.dispatch): its candidates, an org's in-flight count, its org locks,
and the workflow runs its passes look after (gantry.dispatch.candidates, gantry.dispatch.workflows).

None of these is on a runner's hot path: they are sent by Django's cursor,
``%(name)s`` parameters, once per dispatcher tick or pass.
"""

from __future__ import annotations

from gantry.core.models import RUNNER_NOT_ACCEPTED, STOPPING, GroupKind, RunnerStatus
from gantry.sql import literals
from gantry.sql.claim import PRIORITY_LEVELS, claim_order, claimable, has_room, serves
from gantry.sql.runners import holds_run

_GITHUB = f"'{GroupKind.GITHUB_ACTIONS}'"

# ---------------------------------------------------------------- candidates (gantry.dispatch.candidates)

# A bounded batch of pending runs github_actions groups could take now, in the
# claim's order (gantry.sql.claim.claim_order), each org within its room (the module docstring of
# gantry.dispatch.candidates says why each clause is there). The runs are found
# the claim's way, by the claim's rules (gantry.sql.claim): one probe of
# run_claim_order_idx per servable selector and priority.
CANDIDATES = f"""
WITH org_load AS (
    -- In flight: every runner row of the org's github_actions groups, drained or full ones too.
    SELECT g.organization_id AS org_id, COALESCE(o.max_in_flight, %(max_per_org)s) AS cap,
           SUM(g.runner_count) AS in_flight
    FROM runner_group g JOIN organization o ON o.id = g.organization_id
    WHERE g.kind = {_GITHUB}
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
    WHERE g.kind = {_GITHUB} AND {has_room("g")}
      AND l.in_flight < l.cap
),
cand AS (
    -- Per (selector, priority) slice its first runs in the claim's order (its oldest), as the claim probes.
    SELECT c.id, c.priority, c.first_pending_at, grp.organization_id, grp.room,
           array_agg(grp.id ORDER BY grp.id) AS groups
    FROM grp
    JOIN run_selector s ON s.organization_id = grp.organization_id
        AND {serves("s", labels="grp.labels", group_id="grp.id", default_group="grp.default_runner_group_id")}
    CROSS JOIN {PRIORITY_LEVELS}
    CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.first_pending_at FROM run r
        WHERE r.organization_id = grp.organization_id AND r.selector_id = s.id AND r.priority = lvl.priority
          AND {claimable("r")}
        ORDER BY r.first_pending_at, r.id
        LIMIT grp.take
    ) c
    GROUP BY c.id, c.priority, c.first_pending_at, grp.organization_id, grp.room
),
ranked AS (
    SELECT cand.*, row_number() OVER (PARTITION BY organization_id ORDER BY {claim_order("cand")}) AS n FROM cand
)
SELECT id, organization_id, groups, first_pending_at FROM ranked r
WHERE n <= room
ORDER BY {claim_order("r")}
LIMIT %(batch)s
"""

# An org's cap and in-flight count (re-read under the dispatcher's org lock:
# another dispatcher may have dispatched for it since the candidate query).
IN_FLIGHT = f"""
SELECT COALESCE(o.max_in_flight, %(max_per_org)s), COALESCE(SUM(g.runner_count), 0)
FROM organization o LEFT JOIN runner_group g ON g.organization_id = o.id AND g.kind = {_GITHUB}
WHERE o.id = %(org_id)s
GROUP BY o.id, o.max_in_flight
"""

# Session-level advisory locks, one per org, so two dispatchers never dispatch
# for the same org at once (which could take it past its cap): the first takes
# the org, the second moves on to other orgs. (classid, objid) form, with a
# constant class so Gantry's locks never collide with anyone else's; the
# parameters are (LOCK_CLASS, organization id).
LOCK_CLASS = 0x6A17
TRY_LOCK_ORG = "SELECT pg_try_advisory_lock(%s, %s)"
UNLOCK_ORG = "SELECT pg_advisory_unlock(%s, %s)"

# ---------------------------------------------------------------- workflow runs (gantry.dispatch.workflows)

# github_actions runners dispatched but never accepted that no longer hold a
# run (cancelled or skipped while the workflow run booted, or its lease
# lapsed): they can never accept, so their workflow run is cancelled and the
# runner released.
RELEASABLE = f"""
SELECT rn.id, rn.workflow_run_id, rn.runner_group_id FROM runner rn
JOIN runner_group g ON g.id = rn.runner_group_id
WHERE g.kind = {_GITHUB} AND rn.status IN ({literals(RUNNER_NOT_ACCEPTED)}) AND rn.dispatched_at IS NOT NULL
  AND NOT {holds_run("rn.id")}
ORDER BY rn.created_at, rn.id
LIMIT %(limit)s
"""

# Runs whose cancellation was asked before %(before)s (CANCEL_GRACE ago) and
# whose runner has not stopped them: their workflow run is cancelled (the
# runner normally stops its steps, ships the log and reports within seconds).
# Driven from the github_actions runners, through the one-run-per-runner index.
OVERDUE_CANCELS = f"""
SELECT rn.id, rn.workflow_run_id, rn.runner_group_id FROM runner rn
JOIN runner_group g ON g.id = rn.runner_group_id
JOIN run r ON r.assigned_runner_id = rn.id AND r.status IN ({literals(STOPPING)})
WHERE g.kind = {_GITHUB} AND rn.status = '{RunnerStatus.BUSY}' AND rn.workflow_run_id IS NOT NULL
  AND r.cancel_requested_at < %(before)s
ORDER BY r.cancel_requested_at
LIMIT %(limit)s
"""

# Every dispatched workflow run Gantry still has a runner for, oldest first:
# the reconcile pass lists each group's completed runs since its oldest.
LIVE_DISPATCHES = f"""
SELECT rn.runner_group_id, rn.id, rn.workflow_run_id, rn.dispatched_at FROM runner rn
JOIN runner_group g ON g.id = rn.runner_group_id
WHERE g.kind = {_GITHUB} AND rn.workflow_run_id IS NOT NULL AND rn.dispatched_at IS NOT NULL
ORDER BY rn.dispatched_at, rn.id
LIMIT %(limit)s
"""
