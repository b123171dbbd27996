"""Every write to Gantry's domain goes through a function here (docs/design.md).

Views, admin actions, reapers and the dispatcher call these; nothing else
changes a run's status. Callers import the package (``from gantry.core import
services``); the functions live in one module per concern:

- ``transitions`` — the guarded UPDATE every transition is made of, events, lanes
- ``runs`` — a run's edges: assign, lease reset, accept, cancel, finish, fail, time out
- ``deployments`` — queue, skip, retry
- ``runners`` — ready, seen, deregister, dispatch-failed, lost, force-delete, a group's reconcile
- ``tenancy`` — organizations, memberships, runner groups, stacks
- ``members`` — invitations an existing user accepts, set-password links
- ``github`` — github_actions runners: dispatch record, OIDC exchange, workflow run ended, release

The one other place that moves a run is the poll's claim
(``gantry.dispatch.claim``): pending → assigned, in one SQL statement.
"""

from gantry.core.services.deployments import RETRYABLE, deployment_create, deployment_retry, deployment_skip
from gantry.core.services.github import (
    EndedRun,
    github_runner_dispatched,
    github_runner_oidc_exchange,
    github_runner_release,
    github_workflow_run_ended,
)
from gantry.core.services.members import (
    PasswordLink,
    invitation_accept,
    invitation_decline,
    password_link_reissue,
    pending_invitations,
)
from gantry.core.services.runners import (
    RUNNER_METADATA,
    STOP_LEASE_LAPSED,
    STOP_REASONS,
    STOP_RUN_TERMINAL,
    STOP_RUNNER_GONE,
    WORKER_EXITED,
    WORKER_RUNNING,
    WORKER_STATES,
    LostRunner,
    Reconciled,
    StopOrder,
    WorkerReport,
    deregister_hot,
    deregister_hot_plan,
    dispatch_failed,
    group_reconcile,
    holds_run_sql,
    ready_hot,
    ready_hot_plan,
    runner_deregister,
    runner_fail_lost,
    runner_force_delete,
    runner_ready,
    runner_seen,
    runner_status,
    runner_status_plan,
)
from gantry.core.services.runs import (
    accept_hot,
    accept_hot_plan,
    finish_hot,
    finish_hot_plan,
    run_accept,
    run_acknowledge_cancel,
    run_assign,
    run_cancel_backstop,
    run_context,
    run_fail,
    run_finish,
    run_request_cancellation,
    run_reset_lease,
    run_startup_timeout,
)
from gantry.core.services.tenancy import (
    MemberChange,
    membership_set,
    org_create,
    org_set_runs_per_hour_limit,
    org_update,
    runner_group_create,
    runner_group_rotate_token,
    runner_group_set_drained,
    runner_group_update,
    stack_create,
    stack_set_secrets,
    stack_update,
)
from gantry.core.services.transitions import NOTIFY_CHANNEL, notify_claimable, selector_id_for, stack_promote_next

__all__ = [
    "NOTIFY_CHANNEL",
    "RETRYABLE",
    "RUNNER_METADATA",
    "STOP_LEASE_LAPSED",
    "STOP_REASONS",
    "STOP_RUNNER_GONE",
    "STOP_RUN_TERMINAL",
    "WORKER_EXITED",
    "WORKER_RUNNING",
    "WORKER_STATES",
    "EndedRun",
    "LostRunner",
    "MemberChange",
    "PasswordLink",
    "Reconciled",
    "StopOrder",
    "WorkerReport",
    "accept_hot",
    "accept_hot_plan",
    "deployment_create",
    "deployment_retry",
    "deployment_skip",
    "deregister_hot",
    "deregister_hot_plan",
    "dispatch_failed",
    "finish_hot",
    "finish_hot_plan",
    "github_runner_dispatched",
    "github_runner_oidc_exchange",
    "github_runner_release",
    "github_workflow_run_ended",
    "group_reconcile",
    "holds_run_sql",
    "invitation_accept",
    "invitation_decline",
    "membership_set",
    "notify_claimable",
    "org_create",
    "org_set_runs_per_hour_limit",
    "org_update",
    "password_link_reissue",
    "pending_invitations",
    "ready_hot",
    "ready_hot_plan",
    "run_accept",
    "run_acknowledge_cancel",
    "run_assign",
    "run_cancel_backstop",
    "run_context",
    "run_fail",
    "run_finish",
    "run_request_cancellation",
    "run_reset_lease",
    "run_startup_timeout",
    "runner_deregister",
    "runner_fail_lost",
    "runner_force_delete",
    "runner_group_create",
    "runner_group_rotate_token",
    "runner_group_set_drained",
    "runner_group_update",
    "runner_ready",
    "runner_seen",
    "runner_status",
    "runner_status_plan",
    "selector_id_for",
    "stack_create",
    "stack_promote_next",
    "stack_set_secrets",
    "stack_update",
]
