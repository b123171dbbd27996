"""Every change of a run's status, as SQL: one builder, and each effect defined once (docs/decisions.md, 18).

A run moves by one guarded statement, whether one run moves (a request, a
service) or a batch (a reaper), on the hot path or not. :class:`Move` names
an edge of the state machine: the states it leaves, the states it reaches,
its guards, its event. :func:`move_one` and :func:`move_batch` build its
statement, and :func:`effects` adds what every status change brings along,
derived from the Move rather than restated per path:

- **the event**: one ``run_event`` row per moved run;
- **the deployment** follows its newest run, when the edge can change the
  deployment's status (``DEPLOYMENT_STATUS_FOR_RUN``; pending → assigned cannot);
- **the token**: a run that reaches a terminal state has its API token revoked;
- **the lane**: a lane holder that ends frees its stack, whose oldest queued
  run becomes pending in the same statement (``first_pending_at`` stamped the
  first time only), with its own event;
- **the webhooks**: an edge that names a webhook event (:func:`webhook_event`)
  writes one outbox row per subscribed endpoint of the run's org, and one for
  ``deployment.finished`` when the deployment reaches a terminal status
  (:func:`webhook_ctes`; nothing when the org has no endpoint). In the
  statement itself, so a rolled-back transition never sends one.

The claim (gantry.sql.claim) and a new run (:data:`CREATED`) compose the same
effects over their own rows.

Guards. A Move's guards are SQL over the run row (``run.``), the batch's
values (``v.``) and the statement's parameters. For one run, the row is
locked first (``FOR NO KEY UPDATE``: the latest version, which nothing else
can change until commit) and every guard is judged on it, naming the first
that fails (``refused``); the update happens only when none did, and the
statement answers the row state it judged either way. So a refusal is
explained from the very state that refused it (gantry.core.services.transitions),
never from a second read. A batch locks only the rows that pass every guard,
skipping rows another transaction holds (``SKIP LOCKED``: the next sweep sees
them again), and answers the rows it moved.

Lanes. A terminal edge needs the stack locked before its statement's snapshot
(``FOR NO KEY UPDATE``, always stack before run, docs/decisions.md, 4): the
statement then sees every run queued by a transaction that held that lock, and
promotes it. So a terminal move is sent after :data:`LOCK_STACK` (one run) or
:data:`LOCK_STACKS` (a batch) in the same transaction: :func:`one_script` and
:func:`batch_script` put both in one round trip.

NOTIFY needs nothing here: migration 0004's triggers fire per changed row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gantry.core.models import (
    DEPLOYMENT_FINISHED,
    DEPLOYMENT_STATUS_FOR_RUN,
    EXECUTING,
    LANE_HOLDERS,
    NEVER_STARTED,
    PRIORITY_NAMES,
    RUN_PHASES,
    STOPPING,
    TERMINAL,
    WEBHOOK_DEPLOYMENT_FINISHED,
    WEBHOOK_EVENT_OF_STATUS,
    WEBHOOK_RUN_QUEUED,
    WEBHOOK_RUN_RUNNING,
    Run,
    RunnerStatus,
    RunStatus,
)
from gantry.sql import literals
from gantry.sql.rows import columns, width
from gantry.sql.statement import Script, Statement, named


@dataclass(frozen=True)
class Guard:
    """A condition an edge needs: ``sql`` over ``run.``, ``v.`` and parameters; ``words`` say it in a refusal."""

    name: str
    sql: str
    words: str


@dataclass(frozen=True)
class Move:
    """One edge of the run state machine.

    ``targets`` with one state writes it as a literal; several make it the
    ``%(target)s`` parameter (the caller picks one). ``expected`` is matched as
    literals, or as the ``%(expected)s`` parameter when ``expected_param``
    (the edge leaves a subset that depends on the target). ``event`` None is
    the ``%(event)s`` parameter; ``detail`` is a jsonb SQL expression over
    ``moved.`` and parameters. ``sets`` are extra assignments (terminal edges
    add ``finished_at`` and clear the lease themselves). ``extra`` adds CTEs
    after the effects (they may read ``moved``), and ``also``/``joins`` add
    columns to a one-run statement's answer.
    """

    label: str
    expected: frozenset[str]
    targets: frozenset[str]
    event: str | None
    guards: tuple[Guard, ...] = ()
    sets: tuple[str, ...] = ()
    detail: str = "%(detail)s::jsonb"
    expected_param: bool = False
    extra: str = ""
    also: str = ""
    joins: str = ""
    # The SQL types of the edge's own parameters (the common ones are gantry.sql.statement.TYPES).
    types: tuple[tuple[str, str], ...] = ()

    @property
    def terminal(self) -> bool:
        ends = {t in TERMINAL for t in self.targets}
        assert len(ends) == 1, f"{self.label}: targets both terminal and not"
        return ends.pop()

    @property
    def target_sql(self) -> str:
        if len(self.targets) == 1:
            return f"'{next(iter(self.targets))}'"
        return "%(target)s"

    @property
    def status_check(self) -> str:
        if self.expected_param:
            return "run.status = ANY (%(expected)s)"
        return f"run.status IN ({literals(self.expected)})"


def changes_deployment(expected: Iterable[str], targets: Iterable[str]) -> bool:
    """Whether an edge from ``expected`` to ``targets`` can change a deployment's status."""
    return any(DEPLOYMENT_STATUS_FOR_RUN[e] != DEPLOYMENT_STATUS_FOR_RUN[t] for e in expected for t in targets)


def frees_lane(move: Move) -> bool:
    return move.terminal and bool(move.expected & LANE_HOLDERS)


def deployment_status(column: str) -> str:
    """SQL mapping a run status to its deployment's (``DEPLOYMENT_STATUS_FOR_RUN``)."""
    whens = " ".join(f"WHEN '{run}' THEN '{dep}'" for run, dep in sorted(DEPLOYMENT_STATUS_FOR_RUN.items()))
    return f"CASE {column} {whens} END"


def newer_attempt(alias: str) -> str:
    """SQL: a newer attempt of ``alias``'s deployment exists (``alias`` has deployment_id and attempt).

    A deployment follows its newest run; the retention reaper keeps it.
    """
    return (
        f"EXISTS (SELECT 1 FROM run newer WHERE newer.deployment_id = {alias}.deployment_id "
        f"AND newer.attempt > {alias}.attempt)"
    )


# The promotion's edge, for its event and its deployment (queued -> pending).
PROMOTED_EVENT = "promoted"


def effects(move: Move, source: str = "moved") -> list[str]:
    """The CTEs that bring along what a status change means, for the runs of ``source`` that ``move`` moved.

    ``source`` must answer ``id``, ``stack_id``, ``deployment_id``, ``attempt``
    and ``status`` (the new one), and every column ``move.detail`` reads; for
    an edge with a webhook event, every column of the run (the body's).
    """
    ctes = []
    lane = frees_lane(move)
    if lane:
        ctes += [
            # A stack is free when no run of it other than these still holds the
            # lane (these still read as their old status in the statement's snapshot).
            f"""freed AS (
    SELECT DISTINCT {source}.stack_id AS id FROM {source}
    WHERE NOT EXISTS (SELECT 1 FROM run h WHERE h.stack_id = {source}.stack_id
                      AND h.status IN ({literals(LANE_HOLDERS)})
                      AND NOT EXISTS (SELECT 1 FROM {source} o WHERE o.id = h.id))
)""",
            f"""nxt AS (
    SELECT q.id FROM freed CROSS JOIN LATERAL (
        SELECT run.id FROM run WHERE run.stack_id = freed.id AND run.status = '{RunStatus.QUEUED}'
        ORDER BY run.created_at, run.id LIMIT 1
    ) q
)""",
            f"""promoted AS (
    UPDATE run SET status = '{RunStatus.PENDING}', updated_at = %(now)s,
                   first_pending_at = COALESCE(run.first_pending_at, %(now)s)
    FROM nxt WHERE run.id = nxt.id AND run.status = '{RunStatus.QUEUED}'
    RETURNING run.id, run.stack_id, run.deployment_id, run.attempt, run.status
)""",
        ]
    kind = f"'{move.event}'" if move.event is not None else "%(event)s"
    rows = [f"SELECT {source}.id, {kind}, {move.detail} FROM {source}"]
    if lane:
        rows.append(f"SELECT id, '{PROMOTED_EVENT}', '{{}}'::jsonb FROM promoted")
    ctes.append(
        f"events AS (\n    INSERT INTO run_event (run_id, at, kind, detail)\n"
        f"    SELECT id, %(now)s, kind, detail FROM ({' UNION ALL '.join(rows)}) e(id, kind, detail)\n)"
    )
    follow = []
    if changes_deployment(move.expected, move.targets):
        follow.append(f"SELECT deployment_id, attempt, status FROM {source}")
    if lane and changes_deployment({RunStatus.QUEUED}, {RunStatus.PENDING}):
        follow.append("SELECT deployment_id, attempt, status FROM promoted")
    if follow:
        ctes.append(
            f"""deployments AS (
    UPDATE deployment d SET status = f.deployment_status, updated_at = %(now)s
    FROM (SELECT deployment_id, attempt, {deployment_status("status")} AS deployment_status
          FROM ({" UNION ALL ".join(follow)}) x) f
    WHERE d.id = f.deployment_id AND d.status <> f.deployment_status AND NOT {newer_attempt("f")}
    RETURNING d.id, d.status, d.stack_id
)"""
        )
    if move.terminal:
        ctes.append(
            f"revoked AS (UPDATE run_token SET revoked_at = %(now)s "
            f"WHERE run_id IN (SELECT id FROM {source}) AND revoked_at IS NULL)"
        )
    ctes += webhook_ctes(move, source, deployments=bool(follow))
    return ctes


# ---------------------------------------------------------------- the webhook effect (docs/webhooks.md)

# The edges that name a webhook event by themselves; a terminal edge names it by the status it reached.
WEBHOOK_EVENT_OF_EDGE = {"created": WEBHOOK_RUN_QUEUED, "accept": WEBHOOK_RUN_RUNNING}


def webhook_event(move: Move, source: str = "moved") -> str | None:
    """SQL naming the webhook event of a run ``move`` moved (NULL: none), or None when the edge names none.

    The claim (ASSIGN) and the edges between live states other than accept
    name none: their statements stay as they were.
    """
    if move.label in WEBHOOK_EVENT_OF_EDGE:
        return f"'{WEBHOOK_EVENT_OF_EDGE[move.label]}'"
    if move.terminal:
        whens = " ".join(f"WHEN '{status}' THEN '{event}'" for status, event in WEBHOOK_EVENT_OF_STATUS.items())
        return f"CASE {source}.status {whens} END"  # discarded: NULL, which no endpoint matches
    return None


def _seconds(later: str, earlier: str) -> str:
    return f"round(EXTRACT(EPOCH FROM ({later} - {earlier}))::numeric, 3)"


def webhook_run_json(r: str, stack: str) -> str:
    """SQL: the ``run`` object of a webhook body, from the moved row ``r`` and its stack ``stack``.

    Its keys are a contract (docs/webhooks.md): add, never rename. The
    timings are the run's phases in seconds, null until both ends are known.
    """
    priority = f"CASE {r}.priority " + " ".join(f"WHEN {i} THEN '{name}'" for i, name in enumerate(PRIORITY_NAMES))
    # The run answer's phases, from the same table (RUN_PHASES), never below 0 as there.
    timings = ", ".join(
        f"'{name}', GREATEST(0, {_seconds(f'{r}.{later}', f'{r}.{earlier}')})"
        for name, (earlier, later) in RUN_PHASES.items()
    )
    return f"""jsonb_build_object(
        'id', {r}.id, 'status', {r}.status, 'priority', {priority} ELSE {r}.priority::text END,
        'stack_id', {r}.stack_id, 'stack', {stack}.name, 'deployment_id', {r}.deployment_id,
        'attempt', {r}.attempt, 'exit_code', {r}.exit_code, 'failure_reason', {r}.failure_reason,
        'created_at', {r}.created_at, 'first_claimed_at', {r}.first_claimed_at, 'started_at', {r}.started_at,
        'first_output_at', {r}.first_output_at, 'finished_at', {r}.finished_at,
        'timings', jsonb_build_object({timings}))"""


def webhook_ctes(move: Move, source: str, *, deployments: bool) -> list[str]:
    """The outbox rows of ``move`` for the runs of ``source``: one per (run, event, subscribed endpoint).

    First the matches alone (a probe of the org's endpoints: an org with none
    stops here, and no body is built); then the bodies, one JSON text each,
    stored as sent (a retry sends the same bytes). Rows are numbered in a
    run's order (its event before its deployment's), the outbox's order.
    ``deployments``: the effects have a ``deployments`` CTE answering the
    deployments they changed.
    """
    event = webhook_event(move, "src")
    if event is None:
        return []
    matches = [
        f"SELECT e.id, src.id, {event}, 0 FROM {source} src"
        f" JOIN webhook_endpoint e ON e.organization_id = src.organization_id AND e.events ? ({event})"
    ]
    if deployments and move.terminal:
        matches.append(
            f"SELECT e.id, src.id, '{WEBHOOK_DEPLOYMENT_FINISHED}', 1 FROM {source} src"
            f" JOIN deployments dd ON dd.id = src.deployment_id AND dd.status IN ({literals(DEPLOYMENT_FINISHED)})"
            f" JOIN webhook_endpoint e ON e.organization_id = src.organization_id"
            f" AND e.events ? '{WEBHOOK_DEPLOYMENT_FINISHED}'"
        )
    deployment = (
        ", 'deployment', CASE WHEN h.event = "
        f"'{WEBHOOK_DEPLOYMENT_FINISHED}' THEN jsonb_build_object("
        "'id', r.deployment_id, 'status', dd.status, 'stack_id', dd.stack_id) END"
        if len(matches) > 1
        else ""
    )
    join_deployment = " LEFT JOIN deployments dd ON dd.id = r.deployment_id" if deployment else ""
    return [
        f"""hooked AS MATERIALIZED (
    SELECT m.endpoint_id, m.run_id, m.event, m.ord, gen_random_uuid() AS delivery_id
    FROM ({" UNION ALL ".join(matches)}) m(endpoint_id, run_id, event, ord)
)""",
        f"""hooks AS (
    INSERT INTO webhook_delivery (endpoint_id, run_id, event, body, delivery_id, status, attempts,
                                  next_attempt_at, last_error, created_at)
    SELECT h.endpoint_id, h.run_id, h.event,
           (jsonb_strip_nulls(jsonb_build_object('event', h.event, 'delivery_id', h.delivery_id,
                                                 'occurred_at', %(now)s{deployment}))
            || jsonb_build_object('run', {webhook_run_json("r", "s")}))::text,
           h.delivery_id, 'pending', 0, %(now)s, '', %(now)s
    FROM hooked h JOIN {source} r ON r.id = h.run_id LEFT JOIN stack s ON s.id = r.stack_id{join_deployment}
    ORDER BY h.run_id, h.ord, h.endpoint_id
)""",
    ]


# What a one-run statement answers of the row it judged, before any change,
# for the refusal to be explained from (gantry.core.services.transitions.State).
STATE = ("status", "assigned_runner_id", "assigned_expires_at", "started_at", "exit_code", "log_manifest")
STATE_WIDTH = 1 + len(STATE)  # with ``refused`` first
RUN_WIDTH = width(Run)
_RUN_COLUMNS = columns(Run)


def set_clause(move: Move) -> str:
    """The edge's SET list: the target, the time, its own assignments, and a terminal edge's."""
    sets = [f"status = {move.target_sql}", "updated_at = %(now)s", *move.sets]
    if move.terminal:
        sets += ["finished_at = %(now)s", "assigned_at = NULL", "assigned_expires_at = NULL"]
    return ", ".join(sets)


def move_one(move: Move) -> Statement:
    """``move`` for the run ``%(run)s``: lock it, judge every guard, move it if none failed, bring the effects.

    Answers one row: ``refused`` (the first failing check's name: ``status``
    or a guard's; NULL when it moved, or when there is no such run and
    ``status`` is NULL too), the :data:`STATE` it judged, then the moved run's
    columns (NULL when it did not move), then ``move.also``.
    """
    checks = [("status", move.status_check), *((g.name, g.sql) for g in move.guards)]
    refused = "CASE " + " ".join(f"WHEN ({sql}) IS NOT TRUE THEN '{name}'" for name, sql in checks) + " END"
    state = ", ".join(f"run.{c}" for c in STATE)
    ctes = [
        "v AS (SELECT %(run)s::uuid AS id, %(runner)s::uuid AS runner, %(reason)s::text AS reason)",
        f"""cur AS (
    SELECT run.id, {refused} AS refused, {state}
    FROM run JOIN v ON v.id = run.id
    FOR NO KEY UPDATE OF run
)""",
        f"""moved AS (
    UPDATE run SET {set_clause(move)}
    FROM cur JOIN v ON v.id = cur.id
    WHERE run.id = cur.id AND cur.refused IS NULL
    RETURNING {columns(Run, "run")}
)""",
        *effects(move),
    ]
    also = f", {move.also}" if move.also else ""
    sql = (
        f"WITH {', '.join(ctes)}{move.extra}\n"
        f"SELECT cur.refused, {', '.join(f'cur.{c}' for c in STATE)}, "
        f"{columns(Run, 'moved')}{also}\n"
        f"FROM v LEFT JOIN cur ON TRUE LEFT JOIN moved ON TRUE{move.joins}"
    )
    return named(move.label, sql, dict(move.types))


def move_batch(move: Move) -> Statement:
    """``move`` for the runs ``%(ids)s`` (with per-run ``%(runners)s`` and ``%(reasons)s``), as a sweep makes it.

    Only rows passing every guard are locked, and rows another transaction
    holds are skipped; answers :data:`MOVED` of each run it moved.
    """
    where = " AND ".join([move.status_check, *(g.sql for g in move.guards)])
    ctes = [
        "v AS (SELECT * FROM unnest(%(ids)s::uuid[], %(runners)s::uuid[], %(reasons)s::text[])"
        " AS v(id, runner, reason))",
        f"""cur AS (
    SELECT run.id FROM run JOIN v ON v.id = run.id
    WHERE {where}
    FOR NO KEY UPDATE OF run SKIP LOCKED
)""",
        f"""moved AS (
    UPDATE run SET {set_clause(move)}
    FROM cur JOIN v ON v.id = cur.id
    WHERE run.id = cur.id
    RETURNING {columns(Run, "run")}
)""",
        *effects(move),
    ]
    sql = f"WITH {', '.join(ctes)}\nSELECT id, stack_id, organization_id, first_pending_at, status FROM moved"
    return named(move.label + "_batch", sql, dict(move.types))


# The lane locks, taken in a statement of their own before a terminal move
# (its snapshot then sees what the lock waited for). NO KEY UPDATE: it
# serialises lane changes among themselves without blocking the KEY SHARE
# lock that inserting a run (FK to stack) takes.
LOCK_STACK = named(
    "lock_stack_of_run",
    "SELECT s.id FROM run r JOIN stack s ON s.id = r.stack_id WHERE r.id = %(run)s FOR NO KEY UPDATE OF s",
)
LOCK_STACKS = named(
    "lock_stacks_of_runs",
    "SELECT id FROM stack WHERE id IN (SELECT stack_id FROM run WHERE id = ANY(%(ids)s)) ORDER BY id FOR NO KEY UPDATE",
)
LOCK_STACK_BY_ID = named("lock_stack", "SELECT id FROM stack WHERE id = %(stack)s FOR NO KEY UPDATE")


def one_script(move: Move, args: dict[str, Any]) -> Script:
    """The round trip of ``move`` for one run: the lane lock first for an edge that frees it."""
    steps = [(LOCK_STACK, {"run": args["run"]})] if frees_lane(move) else []
    return Script([*steps, (MOVES_ONE[move.label], args)], transaction=bool(steps))


def batch_script(move: Move, args: dict[str, Any]) -> Script:
    """The round trip of ``move`` for a batch: the stacks' locks (in id order) first for an edge that frees lanes."""
    steps = [(LOCK_STACKS, {"ids": args["ids"]})] if frees_lane(move) else []
    return Script([*steps, (MOVES_BATCH[move.label], args)])


# ---------------------------------------------------------------- the guards

RUNNER = Guard("runner", "(v.runner IS NULL OR run.assigned_runner_id = v.runner)", "the runner that holds it")
UNBOUND = Guard(
    "unbound",
    "run.assigned_runner_id IS NULL",
    "no live runner still bound to it (its previous runner must be gone first)",
)
# "No runner can still accept this run": a lease has lapsed when there is none
# (pending runs never carry one) or it is past expiry.
LEASE_LAPSED = "(run.assigned_expires_at IS NULL OR run.assigned_expires_at < %(now)s)"
NEVER_STARTED_GUARD = Guard(
    "never_started",
    f"run.started_at IS NULL AND {LEASE_LAPSED}",
    "a never-started run whose assignment lease has lapsed",
)
# The token's group, folded into a fast-lane statement (it skips the separate
# authentication read): NULL when the caller checked the runner row already.
IN_GROUP = Guard(
    "group",
    "(%(grp)s::bigint IS NULL"
    " OR EXISTS (SELECT 1 FROM runner g WHERE g.id = v.runner AND g.runner_group_id = %(grp)s))",
    "a runner of the token's group",
)


# The moved run's runner group, for the phase histograms by group (gantry.metrics.record_phase):
# the token's group when the fast lane folded it in (no read), else its runner's row by primary key.
RUNNER_GROUP = (
    "COALESCE(%(grp)s::bigint, (SELECT rg.runner_group_id FROM runner rg WHERE rg.id = moved.assigned_runner_id))"
)

# ---------------------------------------------------------------- the edges
#
# Every edge a run can take but two: the claim (gantry.sql.claim, which
# selects its run by the claim's own rules and composes ASSIGN's effects) and
# the promotion (an effect of every edge that frees a lane).

ASSIGN = Move(
    "assign",
    expected=frozenset({RunStatus.PENDING}),
    targets=frozenset({RunStatus.ASSIGNED}),
    event="assigned",
    guards=(UNBOUND,),
    # first_claimed_at: the first claim only (a second claim after a lapsed lease keeps it), the run's phases.
    sets=(
        "assigned_runner_id = v.runner",
        "assigned_at = %(now)s",
        "assigned_expires_at = %(expires)s",
        "first_claimed_at = COALESCE(run.first_claimed_at, %(now)s)",
    ),
    detail="jsonb_build_object('runner_id', moved.assigned_runner_id::text, 'runner_group_id', %(grp)s::bigint)",
)

RESET_LEASE = Move(
    "reset_lease",
    expected=frozenset({RunStatus.ASSIGNED}),
    targets=frozenset({RunStatus.PENDING}),
    event="lease_expired",
    guards=(Guard("lease", "run.assigned_expires_at < %(now)s", "its assignment lease to have lapsed"),),
    # The runner pointer is kept: its runner may still be booting toward accept (One Runner Per Run).
    sets=("assigned_at = NULL", "assigned_expires_at = NULL"),
    detail="'{}'::jsonb",
)

STARTUP_TIMEOUT_REASON = "no runner started the run before the startup deadline"
STARTUP_TIMEOUT = Move(
    "startup_timeout",
    expected=frozenset({RunStatus.PENDING, RunStatus.ASSIGNED}),
    targets=frozenset({RunStatus.STARTUP_TIMEOUT}),
    event="startup_timeout",
    # The reaper's selection ("first pending before the deadline"), judged again on the locked row.
    guards=(
        NEVER_STARTED_GUARD,
        Guard("deadline", "(%(deadline)s IS NULL OR run.first_pending_at < %(deadline)s)", "its startup deadline"),
    ),
    sets=(f"failure_reason = '{STARTUP_TIMEOUT_REASON}'",),
    detail="'{}'::jsonb",
)

CANCEL_BACKSTOP_DETAIL = {"reason": "cancellation was requested before the run started; no runner will acknowledge it"}
CANCEL_BACKSTOP = Move(
    "cancel_backstop",
    expected=frozenset({RunStatus.REQUESTED_CANCELLATION}),
    targets=frozenset({RunStatus.CANCELLED}),
    event="cancel_backstop",
    guards=(NEVER_STARTED_GUARD,),
    detail="%(detail)s::jsonb",
)

# assigned -> running for the runner that holds an unexpired lease: the run's
# API token minted (its hash), the runner busy, and the RunContext's spec and
# secrets read along. Its statement is its own transaction, durable: the run
# is authoritative from here (docs/design.md, "Phase 2: Accept").
ACCEPT = Move(
    "accept",
    expected=frozenset({RunStatus.ASSIGNED}),
    targets=frozenset({RunStatus.RUNNING}),
    event="accepted",
    guards=(
        Guard("runner", "run.assigned_runner_id = v.runner", "the runner it is assigned to"),
        Guard("lease", "run.assigned_expires_at > %(now)s", "an unexpired assignment lease"),
        IN_GROUP,
    ),
    sets=("started_at = %(now)s",),
    detail="jsonb_build_object('runner_id', moved.assigned_runner_id::text)",
    extra=f""",
tok AS (INSERT INTO run_token (run_id, token_sha256, created_at) SELECT id, %(digest)s, %(now)s FROM moved),
busy AS (
    UPDATE runner SET status = '{RunnerStatus.BUSY}', accepted_at = %(now)s, last_seen_at = %(now)s
    WHERE id = %(runner)s AND EXISTS (SELECT 1 FROM moved)
)""",
    also=f"d.spec, s.secrets, {RUNNER_GROUP}",
    joins=" LEFT JOIN deployment d ON d.id = moved.deployment_id LEFT JOIN stack s ON s.id = moved.stack_id",
)

# An executing run -> the outcome its runner reports. The states it may leave
# depend on the outcome (a runner reports cancelled only when cancellation was
# asked of it), so they are a parameter.
FINISH_OUTCOMES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILURE, RunStatus.CANCELLED})
# What a runner reports beside the outcome, by DoneSerializer's field names:
# (the parameter's SQL type, its value when the report leaves the field out).
FINISH_REPORT: dict[str, tuple[str, Any]] = {
    "exit_code": ("integer", None),
    "error": ("text", ""),
    "sealed_chunks": ("integer", None),
    "manifest": ("jsonb", None),
}
FINISH = Move(
    "finish",
    expected=EXECUTING,
    expected_param=True,
    targets=FINISH_OUTCOMES,
    event="finished",
    guards=(RUNNER, IN_GROUP),
    sets=(
        "exit_code = %(exit_code)s",
        "failure_reason = %(error)s",
        "sealed_chunks = COALESCE(%(sealed_chunks)s, run.sealed_chunks)",
        "log_manifest = COALESCE(%(manifest)s, run.log_manifest)",
    ),
    detail="jsonb_build_object('outcome', moved.status, 'exit_code', moved.exit_code)",
    also=RUNNER_GROUP,
    types=tuple((name, kind) for name, (kind, _) in FINISH_REPORT.items()),
)


def finish_expected(outcome: str) -> frozenset[str]:
    """The states /done may end for ``outcome``."""
    if outcome == RunStatus.CANCELLED:
        return STOPPING
    return EXECUTING


def finish_args(outcome: str, report: dict[str, Any]) -> dict[str, Any]:
    """FINISH's own arguments for ``outcome`` and the rest of a runner's report (its defaults where left out)."""
    unknown = set(report) - set(FINISH_REPORT)
    if unknown:
        raise ValueError(f"FINISH has no parameter for {sorted(unknown)}")
    defaults = {name: default for name, (_, default) in FINISH_REPORT.items()}
    return {**defaults, **report, "target": outcome, "expected": sorted(finish_expected(outcome))}


# Any live run -> failure: a runner lost or exited, a dispatch failure, an
# undeliverable accept, a force-delete. The states it may leave, and the
# event, depend on the caller.
FAIL = Move(
    "fail",
    expected=LANE_HOLDERS,
    expected_param=True,
    targets=frozenset({RunStatus.FAILURE}),
    event=None,
    guards=(RUNNER,),
    sets=("failure_reason = v.reason",),
)
# A never-started run its runner could not start (dispatch-failed): failed, not re-queued.
FAIL_UNSTARTED = Move(
    "fail_unstarted",
    expected=frozenset({RunStatus.ASSIGNED, RunStatus.PENDING}),
    targets=frozenset({RunStatus.FAILURE}),
    event="dispatch_failed",
    guards=(
        Guard(
            "runner",
            "run.assigned_runner_id = v.runner AND run.started_at IS NULL",
            "a never-started run assigned to that runner",
        ),
    ),
    sets=("failure_reason = v.reason",),
)
# The silent-runner sweep: executing runs of runners gone silent, each guarded
# on its runner still holding it; per-run reasons.
LOST = Move(
    "lost",
    expected=EXECUTING,
    targets=frozenset({RunStatus.FAILURE}),
    event="runner_lost",
    guards=(RUNNER,),
    sets=("failure_reason = COALESCE(v.reason, run.failure_reason)",),
    detail="'{}'::jsonb",
)

CANCEL_UNSTARTED = Move(
    "cancel_unstarted",
    expected=NEVER_STARTED,
    targets=frozenset({RunStatus.CANCELLED}),
    event="cancelled",
    sets=("cancel_requested_at = %(now)s",),
)
REQUEST_CANCELLATION = Move(
    "request_cancellation",
    expected=frozenset({RunStatus.RUNNING}),
    targets=frozenset({RunStatus.REQUESTED_CANCELLATION}),
    event="cancel_requested",
    sets=("cancel_requested_at = %(now)s",),
)
ACKNOWLEDGE_CANCEL = Move(
    "acknowledge_cancel",
    expected=frozenset({RunStatus.REQUESTED_CANCELLATION}),
    targets=frozenset({RunStatus.CANCELLING}),
    event="cancel_acknowledged",
    guards=(RUNNER,),
    detail="'{}'::jsonb",
)
SKIP = Move(
    "skip",
    expected=NEVER_STARTED,
    targets=frozenset({RunStatus.DISCARDED}),
    event="skipped",
)

MOVES = (
    ASSIGN,
    RESET_LEASE,
    STARTUP_TIMEOUT,
    CANCEL_BACKSTOP,
    ACCEPT,
    FINISH,
    FAIL,
    FAIL_UNSTARTED,
    LOST,
    CANCEL_UNSTARTED,
    REQUEST_CANCELLATION,
    ACKNOWLEDGE_CANCEL,
    SKIP,
)
MOVES_ONE = {m.label: move_one(m) for m in MOVES if m is not LOST}
# The edges the sweeps move in batches.
MOVES_BATCH = {m.label: move_batch(m) for m in (RESET_LEASE, STARTUP_TIMEOUT, CANCEL_BACKSTOP, LOST)}


def one_args(
    *,
    run: Any,
    now: Any,
    runner: Any = None,
    reason: str | None = None,
    detail: str = "{}",
    **more: Any,
) -> dict[str, Any]:
    """A one-run statement's arguments: the ones every edge has, then the edge's own (``more``)."""
    return {"run": run, "now": now, "runner": runner, "reason": reason, "detail": detail, **more}


def batch_args(
    ids: Sequence[Any],
    *,
    now: Any,
    runners: Sequence[Any] | None = None,
    reasons: Sequence[str | None] | None = None,
    detail: str = "{}",
    **more: Any,
) -> dict[str, Any]:
    n = len(ids)
    return {
        "ids": list(ids),
        "runners": list(runners) if runners is not None else [None] * n,
        "reasons": list(reasons) if reasons is not None else [None] * n,
        "now": now,
        "detail": detail,
        **more,
    }


# ---------------------------------------------------------------- a new run

# A run just inserted (on its stack's lane, the stack locked): its "created"
# event and its deployment, by the same effects as any edge: the edge into the
# state it was created in.
CREATED_MOVE = Move(
    "created",
    # From whatever the deployment's previous attempt was: a retry's deployment follows its new run.
    expected=frozenset(RunStatus.values),
    targets=frozenset({RunStatus.QUEUED, RunStatus.PENDING}),
    event="created",
    detail="%(detail)s::jsonb || jsonb_build_object('status', moved.status, 'attempt', moved.attempt)",
)
CREATED = named(
    "created",
    f"WITH moved AS (SELECT {columns(Run)} FROM run WHERE id = %(run)s), "
    + ", ".join(effects(CREATED_MOVE))
    + " SELECT 1",
)

# A new selector for an org, or nothing when a deployment with the same
# selector created it meanwhile (ON CONFLICT: two may race to create it).
SELECTOR_UPSERT = (
    "INSERT INTO run_selector (organization_id, selector) VALUES (%s, %s::jsonb) "
    "ON CONFLICT (organization_id, selector) DO NOTHING"
)
