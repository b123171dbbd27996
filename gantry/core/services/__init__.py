"""Every write to Gantry's domain goes through a function here (docs/design.md).

Views, admin actions, reapers and the dispatcher call these; nothing else
changes a run's status. Callers import the package (``from gantry.core import
services``); the functions live in one module per concern:

- ``transitions`` — the guarded UPDATE every transition is made of, events, lanes
- ``runs`` — a run's edges: assign, lease reset, accept, cancel, finish, fail, time out
- ``deployments`` — queue, skip, retry; archive a stack
- ``runners`` — ready, the heartbeat, deregister, dispatch-failed, lost, force-delete
- ``tenancy`` — organizations, memberships, runner groups, stacks
- ``members`` — invitations an existing user accepts, set-password links
- ``github`` — github_actions runners: dispatch record, OIDC exchange, workflow run ended, release

Every edge is a Move of ``gantry.sql.runs``, whose effects (the event, the
deployment, the token, the lane) are defined there once. The one other place
that moves a run is the poll's claim (``gantry.dispatch.claim``): pending →
assigned with the claim's own selection, composing the same effects. The
runner's hot edges are also plans (``accept_plan``, ``finish_plan``,
``ready_plan``, ``status_plan``, ``deregister_plan``) that the fast lane runs
on the event loop; the service of the same edge drives the same plan.
"""

from gantry.core.services.deployments import (
    RETRYABLE,
    check_idempotency_key,
    check_queue_priority,
    deployment_create,
    deployment_create_once,
    deployment_retry,
    deployment_skip,
    stack_archive,
)
from gantry.core.services.github import (
    EndedRun,
    github_runner_dispatched,
    github_runner_oidc_exchange,
    github_runner_release,
    github_workflow_run_ended,
)
from gantry.core.services.members import (
    PasswordLink,
    api_token_regenerate,
    invitation_accept,
    invitation_decline,
    membership_remove,
    password_link_reissue,
    pending_invitations,
)
from gantry.core.services.runners import (
    RUNNER_METADATA,
    LostRunner,
    deregister_plan,
    dispatch_failed,
    ready_plan,
    runner_deregister,
    runner_fail_lost,
    runner_force_delete,
    runner_ready,
    runner_status,
    status_plan,
)
from gantry.core.services.runs import (
    Refused,
    accept_plan,
    fail_executing_run,
    finish_plan,
    run_accept,
    run_acknowledge_cancel,
    run_assign,
    run_cancel_backstop,
    run_context,
    run_fail,
    run_finish,
    run_request_cancellation,
    run_reset_lease,
    run_set_priority,
    run_startup_timeout,
)
from gantry.core.services.tenancy import (
    MemberChange,
    check_name_free,
    membership_invite,
    membership_set,
    org_create,
    org_set_runs_per_hour_limit,
    org_update,
    runner_group_archive,
    runner_group_create,
    runner_group_rotate_token,
    runner_group_set_drained,
    runner_group_update,
    stack_create,
    stack_set_secrets,
    stack_update,
)
from gantry.core.services.transitions import NOTIFY_CHANNEL, notify_claimable, selector_id_for

__all__ = [
    "NOTIFY_CHANNEL",
    "RETRYABLE",
    "RUNNER_METADATA",
    "EndedRun",
    "LostRunner",
    "MemberChange",
    "PasswordLink",
    "Refused",
    "accept_plan",
    "api_token_regenerate",
    "check_idempotency_key",
    "check_name_free",
    "check_queue_priority",
    "deployment_create",
    "deployment_create_once",
    "deployment_retry",
    "deployment_skip",
    "deregister_plan",
    "dispatch_failed",
    "fail_executing_run",
    "finish_plan",
    "github_runner_dispatched",
    "github_runner_oidc_exchange",
    "github_runner_release",
    "github_workflow_run_ended",
    "invitation_accept",
    "invitation_decline",
    "membership_invite",
    "membership_remove",
    "membership_set",
    "notify_claimable",
    "org_create",
    "org_set_runs_per_hour_limit",
    "org_update",
    "password_link_reissue",
    "pending_invitations",
    "ready_plan",
    "run_accept",
    "run_acknowledge_cancel",
    "run_assign",
    "run_cancel_backstop",
    "run_context",
    "run_fail",
    "run_finish",
    "run_request_cancellation",
    "run_reset_lease",
    "run_set_priority",
    "run_startup_timeout",
    "runner_deregister",
    "runner_fail_lost",
    "runner_force_delete",
    "runner_group_archive",
    "runner_group_create",
    "runner_group_rotate_token",
    "runner_group_set_drained",
    "runner_group_update",
    "runner_ready",
    "runner_status",
    "selector_id_for",
    "stack_archive",
    "stack_create",
    "stack_set_secrets",
    "stack_update",
    "status_plan",
]
