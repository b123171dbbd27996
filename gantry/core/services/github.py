"""github_actions runners: what the dispatcher records, the OIDC exchange, and a workflow run that ended.

The backend dispatcher (``gantry.dispatch.dispatcher``) claims runs through
the one claim function and dispatches a workflow run for each; these are the
writes around that (docs/github-actions.md):

- :func:`github_runner_dispatched` records what GitHub answered on the stub
  runner (the workflow run's id and page, the workflow file, the hash of a
  one-time correlation value);
- :func:`github_runner_oidc_exchange` hands the workflow run its runner token,
  once, against an OIDC token whose repository, workflow and run id match
  what was dispatched;
- :func:`github_workflow_run_ended` handles a workflow run that finished
  while Gantry still had its runner: the run fails (runner lost, or dispatch
  failed if the runner never accepted), so the stack's queue moves on without
  waiting for the reapers' timeouts;
- :func:`github_runner_release` deletes a runner that can no longer accept
  (its run was cancelled, skipped or re-queued while it booted), after the
  dispatcher cancelled its workflow run.

GitHub is never called from here: the dispatcher makes those calls outside
any transaction and brings the answers.
"""

from __future__ import annotations

import hmac
import uuid
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction

from gantry.core import tokens
from gantry.core.errors import NotFound, OidcClaimsMismatch, OidcExchangeUsed, RunnerHoldsRun
from gantry.core.models import (
    EXECUTING,
    NEVER_STARTED,
    STOPPING,
    GroupKind,
    Run,
    Runner,
    RunnerGroup,
    RunnerStatus,
    RunStatus,
)
from gantry.core.services.runners import dispatch_failed, runner_deregister
from gantry.core.services.runs import fail_executing_run, run_finish
from gantry.core.services.transitions import resolve_now


def github_runner_dispatched(
    *,
    runner_id: uuid.UUID,
    workflow_path: str,
    workflow_run_id: int | None = None,
    workflow_run_url: str = "",
    correlation: str = "",
    now: datetime | None = None,
) -> bool:
    """Record on the stub what GitHub answered to the workflow dispatch; False if the stub is gone meanwhile."""
    now = resolve_now(now)
    fields: dict[str, Any] = {
        "dispatched_at": now,
        "workflow_path": workflow_path,
        "workflow_run_url": workflow_run_url,
    }
    if workflow_run_id is not None:
        fields["workflow_run_id"] = workflow_run_id
    if correlation:
        fields["dispatch_correlation_sha256"] = tokens.sha256_hex(correlation)
    return Runner.objects.filter(id=runner_id).update(**fields) == 1


def _runner_run(runner_id: uuid.UUID) -> tuple[uuid.UUID, str] | None:
    """The run this runner was claimed for, and its status (the pointer stays on a finished run)."""
    row = Run.objects.filter(assigned_runner_id=runner_id).order_by("-assigned_at").values_list("id", "status").first()
    return (row[0], str(row[1])) if row is not None else None


def _same(a: str, b: str) -> bool:
    # Owner and repository names are case-insensitive on GitHub.
    return a.lower() == b.lower()


def _check_claims(runner: Runner, group: RunnerGroup, claims: dict[str, Any], correlation: str) -> int | None:
    """Refuse (403) unless the token is the dispatched workflow run's; answers a run id to record, if newly learnt."""
    repository = f"{group.github_owner}/{group.github_repo}"
    if not _same(str(claims.get("repository", "")), repository):
        raise OidcClaimsMismatch(f"the OIDC token is for repository {claims.get('repository')!r}, not {repository}")
    # workflow_ref: "<owner>/<repo>/.github/workflows/<file>@<ref>"
    expected = f"{repository}/{runner.workflow_path}"
    ref_path = str(claims.get("workflow_ref", "")).split("@", 1)[0]
    owner_repo, _, path = ref_path.partition("/.github/")
    if not runner.workflow_path or not _same(owner_repo, repository) or f".github/{path}" != runner.workflow_path:
        raise OidcClaimsMismatch(f"the OIDC token is for workflow {ref_path!r}, not {expected}")
    if claims.get("event_name", "workflow_dispatch") != "workflow_dispatch":
        raise OidcClaimsMismatch("the OIDC token is not from a workflow_dispatch run")
    try:
        token_run = int(str(claims.get("run_id")))
    except ValueError:
        raise OidcClaimsMismatch("the OIDC token carries no workflow run id") from None
    if runner.workflow_run_id is not None:
        if token_run != runner.workflow_run_id:
            raise OidcClaimsMismatch(
                f"the OIDC token is from workflow run {token_run}, not the one dispatched for this runner"
            )
        return None
    if runner.dispatch_correlation_sha256:
        if not correlation or not hmac.compare_digest(
            tokens.sha256_hex(correlation), runner.dispatch_correlation_sha256
        ):
            raise OidcClaimsMismatch("the correlation value is not the one dispatched for this runner")
        return token_run
    raise OidcClaimsMismatch("no workflow run has been recorded for this runner yet")


def github_runner_oidc_exchange(
    *, runner_id: uuid.UUID, claims: dict[str, Any], correlation: str = "", now: datetime | None = None
) -> str:
    """A verified OIDC token → the runner's token (the poll's runner JWT), once.

    ``claims`` come from ``gantry.dispatch.oidc.verify``; here they must name
    the group's repository, the workflow file dispatched and the workflow run
    recorded at dispatch (or, without one, come with the one-time
    correlation value, and the token's run id is recorded). A refusal changes
    nothing.
    """
    now = resolve_now(now)
    with transaction.atomic():
        # Locked: two exchanges racing for one runner take turns, and the second sees the first's stamp.
        runner = Runner.objects.select_for_update().select_related("runner_group").filter(id=runner_id).first()
        if runner is None:
            raise NotFound("runner not found (its claim may have lapsed)")
        group = runner.runner_group
        if group.kind != GroupKind.GITHUB_ACTIONS:
            raise OidcClaimsMismatch("this runner's group is not a github_actions group")
        learnt = _check_claims(runner, group, claims, correlation)
        if runner.oidc_exchanged_at is not None:
            raise OidcExchangeUsed("this runner's credentials were already exchanged; each exchange works once")
        held = _runner_run(runner_id)
        if held is None:
            raise OidcClaimsMismatch("this runner holds no run")
        run_id = held[0]
        fields: dict[str, Any] = {"oidc_exchanged_at": now}
        if learnt is not None:
            fields["workflow_run_id"] = learnt
        Runner.objects.filter(id=runner_id, oidc_exchanged_at__isnull=True).update(**fields)
    return tokens.mint_runner_token(runner_id=runner_id, run_id=run_id, group_id=group.id)


class EndedRun(NamedTuple):
    # The run failed now, if any (its live log wants flushing when it had started).
    run_id: uuid.UUID | None
    started: bool


def github_workflow_run_ended(
    *, runner_id: uuid.UUID, workflow_run_id: int, conclusion: str, now: datetime | None = None
) -> EndedRun | None:
    """The runner's workflow run finished, and the runner never reported ``done``: fail its run.

    Executing → failure as runner lost (the same transition as the inactive-
    runner reaper's, an hour sooner, on evidence), or cancelled when its
    cancellation was asked (the dispatcher cancels the workflow run of a
    runner that does not stop in time); never accepted → a dispatch
    failure (the workflow ended before its runner started, like a launcher's
    startup failure). Answers None when the runner is gone or no longer
    recorded for that workflow run; the caller flushes the live log of a
    started run and then deletes the runner (``github_runner_release``).
    """
    now = resolve_now(now)
    with transaction.atomic():
        runner = (
            Runner.objects.select_for_update(skip_locked=True)
            .select_related("runner_group")
            .filter(id=runner_id, workflow_run_id=workflow_run_id)
            .first()
        )
        if runner is None:
            return None
        held = _runner_run(runner_id)
        if held is None:
            return EndedRun(run_id=None, started=False)
        run_id, status = held
        why = f"GitHub workflow run {workflow_run_id} ended ({conclusion or 'no conclusion'})"
        if status in STOPPING and runner.status == RunnerStatus.BUSY:
            # Cancellation was asked and the workflow run is over (the dispatcher
            # cancelled it when the runner did not stop in time): cancelled is
            # what happened, not a lost runner.
            run_finish(
                run_id=run_id, runner_id=runner_id, outcome=RunStatus.CANCELLED,
                error=f"cancelled: {why} before its runner reported", now=now,
            )  # fmt: skip
            return EndedRun(run_id=run_id, started=True)
        if status in EXECUTING and runner.status == RunnerStatus.BUSY:
            fail_executing_run(
                run_id=run_id, runner_id=runner_id, reason=f"runner lost: {why} without reporting done",
                event="runner_lost", now=now,
            )  # fmt: skip
            return EndedRun(run_id=run_id, started=True)
        if status in NEVER_STARTED:
            dispatch_failed(
                group=runner.runner_group, run_id=run_id, runner_id=runner_id,
                error=f"{why} before its runner accepted the run", now=now,
            )  # fmt: skip
            return EndedRun(run_id=run_id, started=False)
        # Finished already (the runner reported done, or a reaper failed it) but
        # the row stayed: flush again (idempotent) before the row goes.
        return EndedRun(run_id=run_id, started=runner.accepted_at is not None)


def github_runner_release(*, runner_id: uuid.UUID, now: datetime | None = None) -> bool:
    """Delete a github_actions runner that no longer holds a run; False when it holds one again or is gone.

    Its run was cancelled, skipped or re-queued (lease lapsed) while the
    workflow run booted: the runner can never accept, so the dispatcher has
    cancelled the workflow run and this frees the group's slot and the run
    (through the foreign key) at once, instead of at the stub cutoff.
    """
    try:
        runner_deregister(runner_id=runner_id, now=now)
    except (NotFound, RunnerHoldsRun):
        return False
    return True
