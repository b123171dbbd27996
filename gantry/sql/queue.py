"""The queue's reads (gantry.dispatch.queue, gantry.dispatch.demand): waiting runs, groups, demand counts.

Each is a fixed handful of statements whose cost is bounded whatever the
backlog (docs/queue.md): a page reads index ranges, a count stops at
:data:`COUNT_CAP`. Sent by Django's cursor, ``%(name)s`` parameters.
"""

from __future__ import annotations

from gantry.core.models import LANE_HOLDERS, RUNNER_BOUND, WAITING, RunStatus
from gantry.sql import literals
from gantry.sql.claim import PRIORITY_LEVELS, claim_order, claimable, effective_priority, serves

# ---------------------------------------------------------------- the waiting runs (gantry.dispatch.queue)


def _status_range(status: str) -> str:
    # One index range of run_waiting_idx; the status is a literal so the
    # planner matches the partial index's predicate.
    return f"""(SELECT id, created_at FROM run
        WHERE organization_id = %(org_id)s AND status = '{status}'
          AND (created_at, id) > (%(after_at)s, %(after_id)s)
        ORDER BY created_at, id LIMIT %(limit)s)"""


# A page of an org's waiting runs after (%(after_at)s, %(after_id)s): one range
# of run_waiting_idx per status, merged in (created_at, id) order and cut at
# the page's end.
_PAGE_CTE = f"""
WITH page AS (
    {_status_range(RunStatus.QUEUED)}
    UNION ALL {_status_range(RunStatus.PENDING)}
    UNION ALL {_status_range(RunStatus.ASSIGNED)}
    ORDER BY created_at, id LIMIT %(limit)s
)
"""
# Some runs by id (%(run_ids)s), those still waiting.
_RUNS_CTE = f"""
WITH page AS (
    SELECT id, created_at FROM run WHERE id = ANY(%(run_ids)s) AND status IN ({literals(WAITING)})
)
"""
# The page's runs joined with the stack, the selector, the runner a run points
# at, and a queued run's lane holder (a probe of the one-lane-holder unique index);
# last, the run's effective priority at %(now)s (the claim's rule; a run never
# pending has not aged: its own).
_WAITING = f"""
SELECT r.id, r.status, r.stack_id, st.name, r.deployment_id, r.created_at, r.first_pending_at,
       r.selector_id, sel.selector, r.assigned_runner_id, r.assigned_expires_at,
       ru.status, ru.created_at, COALESCE(ru.last_seen_at, ru.accepted_at),
       CASE WHEN r.status = '{RunStatus.QUEUED}' THEN (
           SELECT h.id FROM run h WHERE h.stack_id = r.stack_id AND h.status IN ({literals(LANE_HOLDERS)})
       ) END,
       r.priority, {effective_priority("r")}
FROM page p
JOIN run r ON r.id = p.id
JOIN stack st ON st.id = r.stack_id
JOIN run_selector sel ON sel.id = r.selector_id
LEFT JOIN runner ru ON ru.id = r.assigned_runner_id
ORDER BY r.created_at, r.id
"""
WAITING_PAGE = _PAGE_CTE + _WAITING
WAITING_RUNS = _RUNS_CTE + _WAITING

# ---------------------------------------------------------------- positions (gantry.dispatch.queue)

# A run further down its group's order than this has no position: the read
# stays bounded whatever the backlog. A literal in the statement.
POSITION_CAP = 10_000

# For the runs %(run_ids)s of the org %(org)s that are claimable now: each
# undrained, unarchived group of the org that serves the run, the run's rank
# (1-based) in the claim's order of all the claimable runs that group serves
# (any stack, any selector), and how many of those ahead of it have a higher
# effective priority (at %(now)s, aging %(aging)s). A run gets no row where its
# rank passes POSITION_CAP, nor when it is not claimable.
#
# Why it is bounded: each (selector, priority) slice is read once, whatever
# groups serve it, from run_claim_order_idx oldest first and at most
# POSITION_CAP heads (the claim's probe, deeper). Within a slice oldest first
# is the claim's order (gantry.sql.claim), so a group's first POSITION_CAP runs
# are among its slices' first POSITION_CAP each.
POSITIONS = f"""
WITH page AS (
    SELECT r.id, r.selector_id FROM run r
    WHERE r.id = ANY(%(run_ids)s) AND r.organization_id = %(org)s AND {claimable("r")}
),
grp AS (
    -- The groups that could take a page run.
    SELECT DISTINCT g.id, g.labels, o.default_runner_group_id
    FROM runner_group g
    JOIN organization o ON o.id = g.organization_id
    JOIN run_selector ps ON ps.id IN (SELECT selector_id FROM page)
    WHERE g.organization_id = %(org)s AND g.archived_at IS NULL AND NOT g.drained
      AND {serves("ps", labels="g.labels", group_id="g.id", default_group="o.default_runner_group_id")}
),
served AS (
    -- Every selector each of them serves: its queue holds other selectors' runs too.
    SELECT grp.id AS group_id, s.id AS selector_id FROM grp
    JOIN run_selector s ON s.organization_id = %(org)s
     AND {serves("s", labels="grp.labels", group_id="grp.id", default_group="grp.default_runner_group_id")}
),
head AS (
    SELECT s.selector_id, c.id, c.priority, c.first_pending_at
    FROM (SELECT DISTINCT selector_id FROM served) s CROSS JOIN {PRIORITY_LEVELS} CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.first_pending_at FROM run r
        WHERE r.organization_id = %(org)s AND r.selector_id = s.selector_id AND r.priority = lvl.priority
          AND {claimable("r")}
        ORDER BY r.first_pending_at, r.id
        LIMIT {POSITION_CAP}
    ) c
),
ranked AS (
    -- The claim's order leads with the effective priority, so the runs of a
    -- higher one ahead of a run are all the runs ranked above its priority.
    SELECT served.group_id, h.id,
           row_number() OVER (PARTITION BY served.group_id ORDER BY {claim_order("h")}) AS position,
           rank() OVER (PARTITION BY served.group_id ORDER BY {effective_priority("h")} DESC) - 1 AS ahead_higher
    FROM head h JOIN served ON served.selector_id = h.selector_id
)
SELECT ranked.id, ranked.group_id, ranked.position, ranked.ahead_higher
FROM ranked JOIN page ON page.id = ranked.id
WHERE ranked.position <= {POSITION_CAP}
"""

# The filters :func:`groups` may add, by the parameter each takes.
_GROUP_FILTERS = {"org_id": "g.organization_id = %(org_id)s", "group_id": "g.id = %(group_id)s"}


def groups(*by: str) -> str:
    """Runner groups, each with the org's selectors it serves (the claim's rule, gantry.sql.claim.serves).

    Filtered by the parameters ``by`` names (``org_id``, ``group_id``); all groups by none. Archived groups never.
    """
    # An archived group is gone from the queue's facts (runner_group_archive).
    where = f"WHERE {' AND '.join(['g.archived_at IS NULL', *(_GROUP_FILTERS[name] for name in by)])}"
    return f"""
SELECT g.id, g.organization_id, g.name, g.kind, g.labels, g.max_concurrent_runs, g.runner_count, g.drained,
       g.last_polled_at, g.last_dispatch_error, g.last_dispatch_error_at,
       COALESCE(array_agg(s.id) FILTER (WHERE s.id IS NOT NULL), '{{}}')
FROM runner_group g
JOIN organization o ON o.id = g.organization_id
LEFT JOIN run_selector s ON s.organization_id = g.organization_id
     AND {serves("s", labels="g.labels", group_id="g.id", default_group="o.default_runner_group_id")}
{where}
GROUP BY g.id
ORDER BY g.organization_id, g.name, g.id
"""


# ---------------------------------------------------------------- demand (gantry.dispatch.demand)

# A count stops here: past ten thousand waiting runs of one selector an
# autoscaler has nothing finer to learn, and the scrape stays cheap at any
# queue size. A literal in the statements, not a parameter.
COUNT_CAP = 10_000


def _unbound_pending(and_selector: str) -> str:
    # Per selector, the pending runs no runner holds, counted over at most
    # COUNT_CAP rows of run_claim_order_idx: its predicate, with the status as
    # one literal so the planner matches it.
    return f"""
SELECT s.id, s.organization_id, s.selector, c.n FROM run_selector s
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM run r
        WHERE r.organization_id = s.organization_id AND r.selector_id = s.id AND {claimable("r")}
        LIMIT {COUNT_CAP}
    ) x
) c
WHERE c.n > 0 {and_selector}
"""


UNBOUND_PENDING = _unbound_pending("")
# The same for the selectors %(ids)s only (one group's).
UNBOUND_PENDING_OF_SELECTORS = _unbound_pending("AND s.id = ANY(%(ids)s)")


def _capped(status: str) -> str:
    # One range of run_waiting_idx, the status a literal for its predicate.
    return f"""(SELECT count(*) FROM (SELECT 1 FROM run r WHERE r.organization_id = o.id AND r.status = '{status}'
        LIMIT {COUNT_CAP}) x)"""


# Per org: queued and assigned runs, each counted over at most COUNT_CAP rows
# of run_waiting_idx, and pending runs still pointing at a runner, counted
# from the (small) runner table.
ORG_COUNTS = f"""
SELECT o.id, o.slug, o.runs_per_hour_limit, o.dispatch_throttled_until,
       {_capped(RunStatus.QUEUED)}, {_capped(RunStatus.ASSIGNED)},
       (SELECT count(*) FROM runner ru JOIN runner_group g ON g.id = ru.runner_group_id
        JOIN run r ON r.assigned_runner_id = ru.id
        WHERE g.organization_id = o.id AND r.status = '{RunStatus.PENDING}')
FROM organization o
ORDER BY o.slug
"""


def _running(where: str) -> str:
    # Per group, the runs bound to its runners (assigned or executing), from the runner table.
    return f"""
SELECT ru.runner_group_id, count(*) FROM runner ru
JOIN run r ON r.assigned_runner_id = ru.id AND r.status IN ({literals(RUNNER_BOUND)})
{where}
GROUP BY ru.runner_group_id
"""


RUNNING_BY_GROUP = _running("")
# The same for the group %(group_id)s only.
RUNNING_OF_GROUP = _running("WHERE ru.runner_group_id = %(group_id)s")
