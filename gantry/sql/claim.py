"""The poll's claim as one SQL statement (docs/design.md §5, "Phase 1: Poll"); gantry.dispatch.claim sends it.

The statement does the whole claim: lock the group row, check drain and
capacity, find the org's selectors the group can serve, probe the
pending-run index once per selector, lock the oldest candidate ``FOR UPDATE
SKIP LOCKED``, insert the not_ready stub runner, take the run's ASSIGN edge
(gantry.sql.runs: the same assignments and the same effects as any
pending → assigned), and write the group row once: its ``last_polled_at``
stamp and the stub in its slot count.

Why it stays flat at any backlog (docs/performance.md): it never reads a run
the group cannot take. ``run_selector`` holds an org's *distinct* selectors,
so ``selector <@ labels`` runs over a handful of rows; each matching selector
is then one probe per priority of the partial index ``run_claim_order_idx``
on (organization, selector, priority, first_pending_at, id) WHERE status =
'pending' AND assigned_runner_id IS NULL, each taking its oldest
:data:`CANDIDATES_PER_SELECTOR` runs. Their union is small; the first
unlocked one in the claim's order (:func:`claim_order`) wins.

Why three probes find the claim's first run: within one (selector, priority)
slice the oldest run has also aged the most, so the slice's order by age is
its order in the claim (:func:`effective_priority` never ranks a younger run
of a slice above an older one). The first run overall is therefore the head
of some slice.

Why ``assigned_runner_id IS NULL`` is the whole "names a live runner" test:
the pointer's foreign key is ON DELETE SET NULL, so a non-null pointer always
names an existing runner row, and a runner row is live until deregister or a
reaper deletes it (which nulls the pointer). A lapsed lease keeps the pointer
(One Runner Per Run), so the run stays out of dispatch while its first runner
may still be booting.

Why the group row is locked: a group's runner rows are its slots. Two polls of
one group could both see ``max - 1`` rows and both insert. Counting rows in the
statement would not help: under READ COMMITTED a poll that waited for the other
still reads the runner table as of its own start. So the count lives on the
group row (``runner_count``), and the statement begins by locking that row
``FOR NO KEY UPDATE``: a waiting poll then reads the row's latest version, the
other poll's stub counted. The claim counts its own stub in the same write as
its stamp (the stub carries ``claim_counted``, so the insert trigger that
counts every other runner row skips it): one new version of the group row per
poll, not two (docs/decisions.md, 12). Concurrent polls of *one* group take
turns for the claim's few hundred microseconds; polls of different groups never
wait on each other. Run rows are never waited on: SKIP LOCKED passes over a run
another poll is claiming.
"""

from __future__ import annotations

from gantry.core.models import GroupKind, Priority, RunnerStatus, RunStatus
from gantry.sql.runs import ASSIGN, effects, set_clause
from gantry.sql.statement import named

# ---------------------------------------------------------------- what may be claimed, written once
#
# The claim, the long poll's estimate of what a group could claim
# (:data:`CLAIMABLE_COUNTS`), the backend dispatcher's candidates and the
# queue's group matching (gantry.sql.dispatcher, gantry.sql.queue) all build
# their statements from these three rules.


def claimable(run: str) -> str:
    """SQL: the run (alias ``run``) is claimable: pending and bound to no live runner.

    Written as run_claim_order_idx's own predicate (the status one literal), so
    a probe by (organization, selector) uses that partial index.
    """
    return f"{run}.status = '{RunStatus.PENDING}' AND {run}.assigned_runner_id IS NULL"


def has_room(group: str) -> str:
    """SQL: the group (alias ``group``) may take a run: not drained nor archived, a slot free (``runner_count``,
    decision 2)."""
    return f"NOT {group}.drained AND {group}.archived_at IS NULL AND {group}.runner_count < {group}.max_concurrent_runs"


def serves(selector: str, *, labels: str, group_id: str, default_group: str) -> str:
    """SQL: the group (its ``labels`` and ``group_id``) serves the run selector row ``selector``.

    Every pair of the selector is among the group's labels; an empty selector
    goes to the org's default group (``default_group``), or to any group when
    the org has none.
    """
    return (
        f"{selector}.selector <@ {labels} AND ({selector}.selector <> '{{}}'::jsonb "
        f"OR {default_group} IS NULL OR {default_group} = {group_id})"
    )


# ---------------------------------------------------------------- the claim's order, written once
#
# Higher effective priority first, then the longest pending, then the id. The
# claim, the backend dispatcher's candidates and the queue's positions all
# order by :func:`claim_order`, so what the queue page says is next is what
# the next poll takes.

# The index's priority slices, each probed on its own (the highest first).
PRIORITY_LEVELS = f"(VALUES {', '.join(f'({p})' for p in sorted(Priority.values, reverse=True))}) AS lvl(priority)"


def effective_priority(run: str, *, now: str = "%(now)s", aging: str = "%(aging)s") -> str:
    """SQL: the run's (alias ``run``) priority as the claim ranks it: its own, one level higher for every
    ``aging`` seconds it has been pending, and never above high (docs/queue.md, "Aging").

    A run pending since after ``now`` (a clock a little ahead) has not aged, rather than aged backwards.
    """
    waited = f"GREATEST(0, floor(extract(epoch FROM ({now} - {run}.first_pending_at)) / {aging}))"
    return f"LEAST({int(Priority.HIGH)}, {run}.priority + {waited}::integer)"


def claim_order(run: str, *, now: str = "%(now)s", aging: str = "%(aging)s", rank: str | None = None) -> str:
    """SQL: an ORDER BY list putting the runs (alias ``run``) in the claim's order.

    ``rank``: a column already holding :func:`effective_priority` of the run (a subquery's output). An
    outer query ordered by that column can use the subquery's order; ordered by the expression it cannot
    (PostgreSQL matches sort keys to a subquery's output columns), and sorts every joined row instead.
    """
    first = rank if rank is not None else effective_priority(run, now=now, aging=aging)
    return f"{first} DESC, {run}.first_pending_at, {run}.id"


# Candidates read per matching selector and priority. With k concurrent pollers on one
# selector, a top-1 probe answers empty while work exists most of the time
# (each poller sees the same locked head); 32 measured no false empties at 8
# pollers. A literal, not a parameter, so the plan never depends on it.
CANDIDATES_PER_SELECTOR = 32

# Parameters: now, grp (the group), org (its organization), runner (the stub's
# id), expires (the lease's end), aging (GANTRY_PRIORITY_AGING_SECONDS); version and rate, NULL unless the caller
# asks the statement to judge the group's token version and the org's rate
# itself (a claim whose throttle token was taken ahead, gantry.dispatch.claim).
CLAIM = named(
    "claim",
    f"""
WITH grp AS (
    -- Locks the group row; a poll that waited for another poll of this group
    -- reads the row version that poll wrote, its stub counted.
    SELECT id, labels, runner_count, max_concurrent_runs, drained, archived_at, token_version, organization_id, kind
    FROM runner_group
    WHERE id = %(grp)s::bigint
    FOR NO KEY UPDATE
),
held AS (
    -- The caller's group check (a Vouch), judged again on the locked row when
    -- the claim commits in its own message: the token's version, its org, a
    -- self-hosted group. A NULL version: the caller judges it before commit.
    SELECT grp.id FROM grp
    WHERE %(version)s::bigint IS NULL
       OR (grp.token_version = %(version)s::bigint AND grp.organization_id = %(org)s::bigint
           AND grp.kind <> '{GroupKind.GITHUB_ACTIONS}')
),
eligible AS (
    -- runner_count comes from the locked, latest row version.
    SELECT grp.id, grp.labels FROM grp JOIN held ON TRUE
    WHERE {has_room("grp")}
      -- A token taken ahead at this rate: a rate changed since claims nothing
      -- here (the caller claims again the ordinary way). NULL: not checked.
      AND (%(rate)s::integer IS NULL OR EXISTS (
          SELECT 1 FROM organization o WHERE o.id = %(org)s::bigint AND o.runs_per_hour_limit = %(rate)s::integer))
),
sel AS (
    SELECT s.id FROM run_selector s
    JOIN eligible e ON TRUE
    JOIN organization o ON o.id = s.organization_id
    WHERE s.organization_id = %(org)s::bigint
      AND {serves("s", labels="e.labels", group_id="e.id", default_group="o.default_runner_group_id")}
),
candidate AS (
    -- One probe per (selector, priority) slice. priority and first_pending_at
    -- come out of the index with the id, so the candidates are ordered
    -- before they touch the run table.
    SELECT c.id, c.priority, c.first_pending_at FROM sel CROSS JOIN {PRIORITY_LEVELS} CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.first_pending_at FROM run r
        WHERE r.organization_id = %(org)s::bigint AND r.selector_id = sel.id AND r.priority = lvl.priority
          AND {claimable("r")}
        ORDER BY r.first_pending_at, r.id
        LIMIT {CANDIDATES_PER_SELECTOR}
    ) c
),
picked AS (
    -- The first candidate in the claim's order, one run row at a time,
    -- stopping at the first row it can lock (one primary-key probe, not one
    -- per candidate). The edge's own checks, on the locked row version: a
    -- run claimed meanwhile drops out.
    SELECT run.id FROM (
        SELECT c.*, {effective_priority("c")} AS rank FROM candidate c ORDER BY {claim_order("c", rank="rank")}
    ) c
    JOIN run ON run.id = c.id
    WHERE {ASSIGN.status_check} AND {" AND ".join(g.sql for g in ASSIGN.guards)}
    ORDER BY {claim_order("c", rank="c.rank")}
    LIMIT 1
    FOR UPDATE OF run SKIP LOCKED
),
stub AS (
    -- claim_counted: counted below, in the stamp, not by the insert trigger.
    INSERT INTO runner (id, runner_group_id, status, created_at, hostname, launcher, container_id, pod_name,
                        claim_counted)
    SELECT %(runner)s::uuid, %(grp)s::bigint, '{RunnerStatus.NOT_READY}', %(now)s::timestamptz, '', '', '', '', TRUE
    FROM picked
    RETURNING id
),
v AS (SELECT id AS runner FROM stub),
moved AS (
    UPDATE run SET {set_clause(ASSIGN)}
    FROM picked, v
    WHERE run.id = picked.id
    RETURNING run.id, run.stack_id, run.deployment_id, run.attempt, run.status, run.assigned_runner_id,
              run.first_pending_at, run.priority
),
{", ".join(effects(ASSIGN))},
stamp AS (
    -- One write of the group row per poll, won or empty: the poll's stamp and
    -- its stub (if any) in the slot count. The row is locked by grp above.
    -- Not for a refused group check: a refused call writes nothing.
    UPDATE runner_group SET last_polled_at = %(now)s, runner_count = runner_count + (SELECT count(*) FROM stub)
    WHERE id = %(grp)s::bigint AND EXISTS (SELECT 1 FROM held)
)
-- The rate comes back with the run: the throttle needs it, and reading it here
-- costs no round trip. first_pending_at and priority: for the wait histograms.
SELECT moved.id, o.runs_per_hour_limit, moved.first_pending_at, moved.priority
FROM moved JOIN organization o ON o.id = %(org)s::bigint
""",
)

# A throttled claim's aftermath (gantry.dispatch.claim._stamp_throttled), one
# statement: the org's deferral stamp (guarded on the rate the claim read) and
# the group's contact stamp, which the claim's rollback undid (guarded on
# %(since)s, so a throttled org's polls write the group row once every few
# seconds, not once per poll).
STAMP_THROTTLED = """
WITH contact AS (
    UPDATE runner_group SET last_polled_at = %(now)s
    WHERE id = %(grp)s AND (last_polled_at IS NULL OR last_polled_at < %(since)s)
)
UPDATE organization SET dispatch_throttled_until = %(until)s
WHERE id = %(org)s AND runs_per_hour_limit = %(rate)s
"""

# The channel parked long polls and the backend dispatcher LISTEN on. Triggers
# on run and runner (migration 0004) notify it when a run becomes claimable.
NOTIFY_CHANNEL = "gantry_claimable"
NOTIFY = "SELECT pg_notify(%s, %s)"

# About how many runs each of the groups ``%(groups)s`` could claim now, for the
# groups that could claim one (gantry.server.asyncpoll: whom a NOTIFY wakes):
# the claim's own rules, read without locking anything, at most
# CLAIMABLE_ESTIMATE_CAP runs per selector. A throttled org's groups are left
# out until its next refill.
CLAIMABLE_ESTIMATE_CAP = 64
CLAIMABLE_COUNTS = f"""
SELECT g.id, g.organization_id,
       LEAST(g.max_concurrent_runs - g.runner_count, (
           SELECT count(*) FROM (
               SELECT 1 FROM run_selector s CROSS JOIN LATERAL (
                   SELECT 1 FROM run r
                   WHERE r.organization_id = s.organization_id AND r.selector_id = s.id AND {claimable("r")}
                   LIMIT {CLAIMABLE_ESTIMATE_CAP}
               ) x
               WHERE s.organization_id = g.organization_id
                 AND {serves("s", labels="g.labels", group_id="g.id", default_group="o.default_runner_group_id")}
               LIMIT {CLAIMABLE_ESTIMATE_CAP}
           ) y
       ))
FROM runner_group g JOIN organization o ON o.id = g.organization_id
WHERE g.id = ANY(%(groups)s) AND {has_room("g")}
  AND (o.dispatch_throttled_until IS NULL OR o.dispatch_throttled_until <= now())
"""

# The long poll's listener (gantry.dispatch.longpoll): the channels it listens
# on, and the advisory lock whose holder leads (wakes the parked polls of
# orgs another process has none of).
FOLLOW_CHANNEL = "gantry_claimable_follow"
LISTEN = f"LISTEN {NOTIFY_CHANNEL}; LISTEN {FOLLOW_CHANNEL}"
TRY_LEAD = "SELECT pg_try_advisory_lock(%s)"
