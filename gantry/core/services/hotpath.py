"""The runner protocol's hot edges as fixed SQL: ready, status, accept, done, deregister (docs/performance.md).

Each is the same guarded transition the ORM path wrote (``transitions``):
the same WHERE guard, the same event, the same deployment sync, the same lane
promotion, the same token mint or revoke; only built once per database
session (a prepared statement) instead of compiled on every call, and sent in
one round trip. A guard that fails changes nothing, and the caller falls back
to the ORM path's refusal (which names the cause): the cold path stays the
ORM's, the common path is this.

The status lists are literals from :mod:`gantry.core.models`, never
parameters, so plans are fixed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gantry.core import prepared
from gantry.core.models import (
    DEPLOYMENT_STATUS_FOR_RUN,
    EXECUTING,
    LANE_HOLDERS,
    Deployment,
    Run,
    RunnerStatus,
    RunStatus,
    Stack,
)


def _literals(statuses: frozenset[str]) -> str:
    return ", ".join(f"'{s}'" for s in sorted(statuses))


# The token's group, folded into the route's statement (gantry.api.fastlane
# skips the separate authentication read): NULL when the caller has checked
# the runner row already (the Django view's authentication did).
_IN_GROUP = "(%(grp)s::bigint IS NULL OR runner_group_id = %(grp)s)"
_RUNNER_IN_GROUP = (
    "(%(grp)s::bigint IS NULL"
    " OR EXISTS (SELECT 1 FROM runner g WHERE g.id = %(runner)s AND g.runner_group_id = %(grp)s))"
)


# ---------------------------------------------------------------- ready

# not_ready → ready. A metadata field the runner did not send stays as it is
# (NULL means "not given": the service drops None values before this).
READY = prepared.Statement(
    "ready",
    f"""
UPDATE runner SET status = '{RunnerStatus.READY}', ready_at = %(now)s,
    hostname = COALESCE(%(hostname)s, hostname), launcher = COALESCE(%(launcher)s, launcher),
    pid = COALESCE(%(pid)s, pid), container_id = COALESCE(%(container_id)s, container_id),
    pod_name = COALESCE(%(pod_name)s, pod_name), workflow_run_id = COALESCE(%(workflow_run_id)s, workflow_run_id)
WHERE id = %(runner)s AND status = '{RunnerStatus.NOT_READY}' AND {_IN_GROUP}
RETURNING id
""",
    [
        ("runner", "uuid"),
        ("grp", "bigint"),
        ("now", "timestamptz"),
        ("hostname", "text"),
        ("launcher", "text"),
        ("pid", "integer"),
        ("container_id", "text"),
        ("pod_name", "text"),
        ("workflow_run_id", "bigint"),
    ],
)


def ready_plan(
    *, runner_id: uuid.UUID, group_id: int | None, metadata: Mapping[str, Any], now: datetime
) -> prepared.Plan[bool]:
    """True when the runner (of ``group_id``, when given) went not_ready → ready now."""
    params = {
        k: metadata.get(k) for k in ("hostname", "launcher", "pid", "container_id", "pod_name", "workflow_run_id")
    }
    args = {**params, "now": now, "runner": runner_id, "grp": group_id}
    # No wait for the WAL flush (as /status): ready only records that the
    # runner is up; accept does not depend on it, and accept's durable commit
    # flushes it along. A database crash inside the flush window loses the
    # stamp, not a run (docs/decisions.md, 13).
    ((rows),) = yield prepared.Script([(READY, args)], synchronous_commit=False)
    return bool(rows)


# ---------------------------------------------------------------- status

# The runner's /status in one statement, its authentication folded in: does
# the token's runner still exist (in the token's group), and, when the path is
# the token's run, refresh its liveness and read the run's status. A refused
# call (runner gone, another run) writes nothing.
#
# Its commit does not wait for the WAL flush (BEGIN; SET LOCAL
# synchronous_commit = off; EXECUTE; COMMIT in one message): the only write is
# the heartbeat, which the runner repeats every few seconds and which the
# inactive-runner reaper judges over minutes, so a database crash inside the
# flush window (wal_writer_delay) loses nothing that matters. It halved the
# route's PostgreSQL CPU (docs/performance.md, "Runner routes").
_STATUS_SQL = """
WITH me AS (SELECT id FROM runner WHERE id = %(runner)s AND runner_group_id = %(grp)s),
seen AS (UPDATE runner SET last_seen_at = %(now)s WHERE id = (SELECT id FROM me) AND %(bound)s)
SELECT EXISTS (SELECT 1 FROM me), (SELECT status FROM run WHERE id = %(run)s AND %(bound)s)
"""
STATUS = prepared.Statement(
    "status",
    _STATUS_SQL,
    [("runner", "uuid"), ("grp", "bigint"), ("now", "timestamptz"), ("bound", "boolean"), ("run", "uuid")],
)
# runner_seen's form, for callers that have authenticated the runner already
# (durable commit: it is not the route's hot path).
SEEN = prepared.Statement(
    "seen",
    """
WITH seen AS (UPDATE runner SET last_seen_at = %(now)s WHERE id = %(runner)s)
SELECT TRUE, (SELECT status FROM run WHERE id = %(run)s)
""",
    [("runner", "uuid"), ("now", "timestamptz"), ("run", "uuid")],
)


def status_plan(
    *, runner_id: uuid.UUID, group_id: int | None, run_id: uuid.UUID, bound: bool, now: datetime
) -> prepared.Plan[tuple[bool, str | None]]:
    """(the runner exists in ``group_id``, the run's status or None when missing or not ``bound``)."""
    args = {"runner": runner_id, "grp": group_id, "run": run_id, "bound": bound, "now": now}
    ((row,),) = yield prepared.Script([(STATUS, args)], synchronous_commit=False)
    return bool(row[0]), row[1]


def seen(*, runner_id: uuid.UUID, run_id: uuid.UUID, now: datetime) -> str | None:
    """Refresh the runner's liveness; the run's status, or None when there is no such run."""
    row = prepared.fetchone(SEEN, {"runner": runner_id, "run": run_id, "now": now})
    assert row is not None
    return row[1]


# ---------------------------------------------------------------- deregister


def deregister_statement(holds_run_sql: str) -> prepared.Statement:
    """Delete the runner unless it holds a run (``holds_run_sql``: runners.holds_run_sql of ``%(runner)s``)."""
    return prepared.Statement(
        "deregister",
        f"DELETE FROM runner WHERE id = %(runner)s AND {_IN_GROUP} AND NOT {holds_run_sql} RETURNING id",
        [("runner", "uuid"), ("now", "timestamptz"), ("grp", "bigint")],
    )


def deregister_plan(
    *, statement: prepared.Statement, runner_id: uuid.UUID, group_id: int | None, now: datetime
) -> prepared.Plan[bool]:
    """True when the runner row (of ``group_id``, when given) was deleted."""
    args = {"runner": runner_id, "now": now, "grp": group_id}
    # No wait for the WAL flush: a deregister lost in a database crash inside
    # the flush window leaves a runner row whose run is over, which the
    # silent-runner sweep deletes (its slot held until then); the next durable
    # commit flushes it anyway (docs/decisions.md, 13).
    ((rows),) = yield prepared.Script([(statement, args)], synchronous_commit=False)
    return bool(rows)


# ---------------------------------------------------------------- accept

_RUN_COLUMNS = prepared.columns(Run)
_RUN_WIDTH = prepared.width(Run)

# assigned → running, the token minted, the runner busy, the event, the
# deployment brought along (as sync_deployment: unless a newer attempt
# exists), and the RunContext's spec and secrets read with it. One statement,
# so one transaction without BEGIN or COMMIT; it locks run then runner, the
# order every other writer of both uses.
ACCEPT = prepared.Statement(
    "accept",
    f"""
WITH acc AS (
    UPDATE run SET status = '{RunStatus.RUNNING}', started_at = %(now)s::timestamptz, updated_at = %(now)s
    WHERE id = %(run)s::uuid AND status = '{RunStatus.ASSIGNED}' AND assigned_runner_id = %(runner)s::uuid
      AND assigned_expires_at > %(now)s AND {_RUNNER_IN_GROUP}
    RETURNING {_RUN_COLUMNS}
),
tok AS (INSERT INTO run_token (run_id, token_sha256, created_at) SELECT id, %(digest)s::text, %(now)s FROM acc),
busy AS (
    UPDATE runner SET status = '{RunnerStatus.BUSY}', accepted_at = %(now)s, last_seen_at = %(now)s
    WHERE id = %(runner)s AND EXISTS (SELECT 1 FROM acc)
),
event AS (
    INSERT INTO run_event (run_id, at, kind, detail)
    SELECT id, %(now)s, 'accepted', jsonb_build_object('runner_id', %(runner)s::text) FROM acc
),
dep AS (
    UPDATE deployment d SET status = '{DEPLOYMENT_STATUS_FOR_RUN[RunStatus.RUNNING]}', updated_at = %(now)s
    FROM acc
    WHERE d.id = acc.deployment_id AND d.status <> '{DEPLOYMENT_STATUS_FOR_RUN[RunStatus.RUNNING]}'
      AND NOT EXISTS (SELECT 1 FROM run n WHERE n.deployment_id = acc.deployment_id AND n.attempt > acc.attempt)
)
SELECT acc.*, d.spec, s.secrets FROM acc
JOIN deployment d ON d.id = acc.deployment_id JOIN stack s ON s.id = acc.stack_id
""",
    [("run", "uuid"), ("runner", "uuid"), ("now", "timestamptz"), ("digest", "text"), ("grp", "bigint")],
)


def accept_plan(
    *, run_id: uuid.UUID, runner_id: uuid.UUID, group_id: int | None, digest: str, now: datetime
) -> prepared.Plan[Run | None]:
    """The accepted run (its deployment's spec and stack's secrets loaded), or None when the guard failed."""
    args = {"run": run_id, "runner": runner_id, "digest": digest, "now": now, "grp": group_id}
    # One statement: its own transaction, durable (the run is authoritative from here).
    (rows,) = yield prepared.Script([(ACCEPT, args)], transaction=False)
    if not rows:
        return None
    row = rows[0]
    run = prepared.instance(Run, row)
    # As select_related would: run_context reads run.deployment.spec and
    # run.stack.secrets without a query (only those fields are loaded).
    run.deployment = _partial(Deployment, run.deployment_id, "spec", row[_RUN_WIDTH])
    run.stack = _partial(Stack, run.stack_id, "secrets", row[_RUN_WIDTH + 1])
    return run


def _partial(model: type[Deployment] | type[Stack], pk: int, name: str, raw: str | None) -> Any:
    # Both are JSON columns with the default decoder; Django has psycopg hand them over as text.
    return prepared.loaded(model, id=pk, **{name: json.loads(raw) if raw is not None else None})


# ---------------------------------------------------------------- done

# The lane lock first, in a statement of its own: the finish below then reads
# with a snapshot taken after the lock was granted, so a run queued on this
# stack by a transaction that held the lock is seen and promoted (the race
# lock_stack exists for).
LOCK_STACK = prepared.Statement(
    "done_lock",
    "SELECT s.id FROM run r JOIN stack s ON s.id = r.stack_id WHERE r.id = %(run)s FOR NO KEY UPDATE OF s",
    [("run", "uuid")],
)

# An executing run (this runner's) → its outcome; its event; its deployment;
# its API token revoked; and, the lane now free, the stack's oldest queued run
# promoted to pending with its own event and deployment sync (stack_promote_next).
FINISH = prepared.Statement(
    "done_finish",
    f"""
WITH fin AS (
    UPDATE run SET status = %(outcome)s, updated_at = %(now)s, finished_at = %(now)s, assigned_at = NULL,
        assigned_expires_at = NULL, exit_code = %(exit_code)s, failure_reason = %(error)s,
        sealed_chunks = COALESCE(%(sealed)s, sealed_chunks), log_manifest = COALESCE(%(manifest)s, log_manifest)
    WHERE id = %(run)s AND status = ANY (%(expected)s) AND assigned_runner_id = %(runner)s AND {_RUNNER_IN_GROUP}
    RETURNING {_RUN_COLUMNS}
),
event AS (
    INSERT INTO run_event (run_id, at, kind, detail)
    SELECT id, %(now)s, 'finished', jsonb_build_object('outcome', %(outcome)s, 'exit_code', %(exit_code)s) FROM fin
),
dep AS (
    UPDATE deployment d SET status = %(deployment_status)s, updated_at = %(now)s FROM fin
    WHERE d.id = fin.deployment_id AND d.status <> %(deployment_status)s
      AND NOT EXISTS (SELECT 1 FROM run n WHERE n.deployment_id = fin.deployment_id AND n.attempt > fin.attempt)
),
revoke AS (
    UPDATE run_token SET revoked_at = %(now)s
    WHERE run_id = %(run)s AND revoked_at IS NULL AND EXISTS (SELECT 1 FROM fin)
),
nxt AS (
    -- The lane is free once this run ends: no other lane holder on the stack
    -- (this run still reads as its old status in the statement's snapshot).
    SELECT q.id FROM fin JOIN run q ON q.stack_id = fin.stack_id AND q.status = '{RunStatus.QUEUED}'
    WHERE NOT EXISTS (SELECT 1 FROM run h WHERE h.stack_id = fin.stack_id AND h.id <> fin.id
                      AND h.status IN ({_literals(LANE_HOLDERS)}))
    ORDER BY q.created_at, q.id
    LIMIT 1
),
promoted AS (
    UPDATE run SET status = '{RunStatus.PENDING}', updated_at = %(now)s,
        first_pending_at = COALESCE(run.first_pending_at, %(now)s)
    FROM nxt WHERE run.id = nxt.id AND run.status = '{RunStatus.QUEUED}'
    RETURNING run.id, run.deployment_id, run.attempt
),
promoted_event AS (
    INSERT INTO run_event (run_id, at, kind, detail) SELECT id, %(now)s, 'promoted', '{{}}'::jsonb FROM promoted
),
promoted_dep AS (
    UPDATE deployment d SET status = '{DEPLOYMENT_STATUS_FOR_RUN[RunStatus.PENDING]}', updated_at = %(now)s
    FROM promoted p
    WHERE d.id = p.deployment_id AND d.status <> '{DEPLOYMENT_STATUS_FOR_RUN[RunStatus.PENDING]}'
      AND NOT EXISTS (SELECT 1 FROM run n WHERE n.deployment_id = p.deployment_id AND n.attempt > p.attempt)
)
SELECT * FROM fin
""",
    [
        ("run", "uuid"),
        ("runner", "uuid"),
        ("outcome", "text"),
        ("expected", "text[]"),
        ("now", "timestamptz"),
        ("exit_code", "integer"),
        ("error", "text"),
        ("sealed", "integer"),
        ("manifest", "jsonb"),
        ("deployment_status", "text"),
        ("grp", "bigint"),
    ],
)


def finish_plan(
    *,
    run_id: uuid.UUID,
    runner_id: uuid.UUID,
    group_id: int | None,
    outcome: str,
    expected: frozenset[str],
    exit_code: int | None,
    error: str,
    sealed_chunks: int | None,
    manifest: Mapping[str, Any] | None,
    now: datetime,
) -> prepared.Plan[Run | None]:
    """The finished run, or None when the guard failed (nothing changed: the caller finds out why)."""
    args = {
        "run": run_id,
        "runner": runner_id,
        "outcome": outcome,
        "expected": sorted(expected),
        "now": now,
        "exit_code": exit_code,
        "error": error,
        "sealed": sealed_chunks,
        "manifest": json.dumps(manifest) if manifest is not None else None,
        "deployment_status": DEPLOYMENT_STATUS_FOR_RUN[outcome],
        "grp": group_id,
    }
    _, rows = yield prepared.Script([(LOCK_STACK, {"run": run_id}), (FINISH, args)])
    return prepared.instance(Run, rows[0]) if rows else None


__all__ = ["EXECUTING", "accept_plan", "deregister_plan", "finish_plan", "ready_plan", "status_plan"]
