"""Runner rows as SQL: ready, the heartbeat (/status), deregister, and what "holds a run" means.

A runner *holds* a run while it is executing it (running, requested_cancellation,
cancelling) or was dispatched for it and could still accept (assigned with an
unexpired lease). :func:`holds_run` is that test, written once and used by
deregister, reconcile, the stub reaper and the silent-runner sweep.

Like the run edges (gantry.sql.runs), a one-runner statement answers the
state it judged, so its refusal is explained from that state
(gantry.core.services.runners), never from a second read.
"""

from __future__ import annotations

from gantry.core.models import EXECUTING, RunnerStatus, RunStatus
from gantry.sql import literals
from gantry.sql.statement import named


def holds_run(runner: str) -> str:
    """SQL, true while the runner whose id is the SQL expression ``runner`` still holds a run.

    The statement supplies ``%(now)s``. The statuses are literals, so the
    planner can match them against the partial indexes on run.
    """
    return (
        f"EXISTS (SELECT 1 FROM run WHERE run.assigned_runner_id = {runner} AND (run.status IN ({literals(EXECUTING)}) "
        f"OR (run.status = '{RunStatus.ASSIGNED}' AND run.assigned_expires_at > %(now)s)))"
    )


# The token's group, when the statement checks it itself (the fast lane, which
# skips the separate authentication read); NULL when the caller did.
_IN_GROUP = "(%(grp)s::bigint IS NULL OR runner_group_id = %(grp)s)"

# not_ready -> ready, recording where the runner runs; a replay (ready
# already: its first answer may have been lost) records what it sends again.
# A metadata field the runner did not send stays as it is (NULL means "not
# given"). The row is locked first, so the status answered is the one judged:
# busy (accepted) refuses, and no row means gone (or another group's).
READY = named(
    "ready",
    f"""
WITH me AS (
    SELECT id, status FROM runner WHERE id = %(runner)s AND {_IN_GROUP} FOR NO KEY UPDATE
),
up AS (
    UPDATE runner SET status = '{RunnerStatus.READY}',
        ready_at = CASE WHEN me.status = '{RunnerStatus.NOT_READY}' THEN %(now)s ELSE runner.ready_at END,
        hostname = COALESCE(%(hostname)s, hostname), launcher = COALESCE(%(launcher)s, launcher),
        pid = COALESCE(%(pid)s, pid), container_id = COALESCE(%(container_id)s, container_id),
        pod_name = COALESCE(%(pod_name)s, pod_name), workflow_run_id = COALESCE(%(workflow_run_id)s, workflow_run_id)
    FROM me
    WHERE runner.id = me.id AND me.status IN ('{RunnerStatus.NOT_READY}', '{RunnerStatus.READY}')
)
SELECT (SELECT status FROM me)
""",
)

# The runner's /status, its authentication folded in: does the token's runner
# still exist (in the token's group), and, when the path is the token's run
# (``bound``), refresh its liveness and read the run's status. A refused call
# (runner gone, another run) writes nothing. ``last_seen_at`` is in no index,
# so the heartbeat is a heap-only update (migration 0016).
STATUS = named(
    "status",
    """
WITH me AS (SELECT id FROM runner WHERE id = %(runner)s AND runner_group_id = %(grp)s),
seen AS (UPDATE runner SET last_seen_at = %(now)s WHERE id = (SELECT id FROM me) AND %(bound)s)
SELECT EXISTS (SELECT 1 FROM me), (SELECT status FROM run WHERE id = %(run)s AND %(bound)s)
""",
)

# Delete the runner unless it holds a run, answering what was judged: whether
# it exists (of the token's group), whether it holds a run, whether it went.
# The hold is read in the statement's snapshot, as the delete's: a concurrent
# accept's run lock makes that accept commit first or see the runner gone.
# The foreign key's ON DELETE SET NULL releases any run still pointing here.
DEREGISTER = named(
    "deregister",
    f"""
WITH me AS (SELECT id, {holds_run("runner.id")} AS holds FROM runner WHERE id = %(runner)s AND {_IN_GROUP}),
gone AS (DELETE FROM runner WHERE id IN (SELECT id FROM me WHERE NOT holds) RETURNING id)
SELECT EXISTS (SELECT 1 FROM me), COALESCE((SELECT holds FROM me), FALSE), EXISTS (SELECT 1 FROM gone)
""",
)

# Deregister's rule for runners a group's coordinator reports gone (reconcile).
DELETE_OF_GROUP = (
    f"DELETE FROM runner WHERE id = %(runner)s AND runner_group_id = %(group)s AND NOT {holds_run('%(runner)s')}"
)
