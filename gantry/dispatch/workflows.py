"""The backend dispatcher's side of GitHub: its client and launchers, and the two passes over workflow runs.

- :func:`release_pass`: a github_actions runner that no longer holds a run
  (its run was cancelled or skipped while the workflow run booted, or its
  lease lapsed) can never accept. Its workflow run is cancelled
  (``POST …/actions/runs/{id}/cancel``) and the runner deleted, which frees
  the group's slot and, through the foreign key, the run (re-queued ones are
  dispatched again; One Runner Per Run holds because the old workflow run is
  cancelled first).
- :func:`cancel_overdue_pass`: a run whose cancellation was asked and whose
  runner has not stopped it :data:`CANCEL_GRACE` later has its workflow run
  cancelled (the runner normally stops its steps and reports within seconds).
- :func:`reconcile_pass`: a workflow run that ended while Gantry still has its
  runner ended without ``done`` (a runner that reports done deregisters before
  its job ends). Found by listing each group's completed ``workflow_dispatch``
  runs since its oldest live dispatch, at most :data:`RECONCILE_PAGES` pages
  per group and :data:`RECONCILE_GROUPS` groups per pass, each group at most
  every :data:`RECONCILE_INTERVAL` seconds; the run fails through
  ``services.github_workflow_run_ended`` (runner lost, or dispatch failed if
  it never accepted), its live log is flushed to storage like the inactive-
  runner reaper does, and the runner is deleted. What the listing misses, the
  reapers still catch on their timeouts.

Every GitHub call here happens outside any database transaction.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from gantry import conf
from gantry.core import services
from gantry.core.models import RunnerGroup
from gantry.logs import flush_live_log
from gantry.sql import dispatcher as sql
from launchers.github_actions import GitHubActionsLauncher
from launchers.github_actions.api import GitHubApi, GitHubError

log = logging.getLogger("gantry.dispatcher")

RELEASE_BATCH = 50
RECONCILE_GROUPS = 20
RECONCILE_PAGES = 2
RECONCILE_INTERVAL = 30.0
RECONCILE_RUNNERS = 2000

# A run whose cancellation was asked this long ago and that its runner has
# not stopped has its workflow run cancelled (gantry.sql.dispatcher.OVERDUE_CANCELS).
CANCEL_GRACE = timedelta(minutes=2)


class GitHub:
    """The instance's GitHub access (``GANTRY_GITHUB_*``), and one launcher per group configuration."""

    def __init__(self) -> None:
        cfg = conf.github()
        self.public_url = cfg.public_url
        self.configured = bool(cfg.mode and cfg.public_url)
        self._cfg = cfg
        self._api: GitHubApi | None = None
        self._launchers: dict[tuple[str, str, str, str], GitHubActionsLauncher] = {}
        self._reconciled: dict[int, float] = {}  # group id → when its runs were last listed (monotonic)
        self.cancelled: set[int] = set()  # workflow runs this process cancelled for an overdue cancellation

    @property
    def api(self) -> GitHubApi:
        if self._api is None:
            cfg = self._cfg
            self._api = GitHubApi(
                api_url=cfg.api_url, token=cfg.token, app_id=cfg.app_id, app_private_key=cfg.app_private_key
            )
        return self._api

    def launcher(self, group: RunnerGroup) -> GitHubActionsLauncher:
        key = (group.github_owner, group.github_repo, group.github_workflow, group.github_ref)
        if key not in self._launchers:
            self._launchers[key] = GitHubActionsLauncher(
                api=self.api, owner=key[0], repo=key[1], workflow=key[2], ref=key[3]
            )
        return self._launchers[key]

    def reconcile_due(self, group_id: int) -> bool:
        last = self._reconciled.get(group_id)
        return last is None or time.monotonic() - last >= RECONCILE_INTERVAL

    def reconciled(self, group_id: int) -> None:
        self._reconciled[group_id] = time.monotonic()


def cancel_quietly(github: GitHub, group: RunnerGroup, workflow_run_id: object) -> bool:
    """Cancel a workflow run, logging (not raising) a refusal; True when it is stopped or was already over."""
    if not isinstance(workflow_run_id, int):
        return True  # never found: nothing to cancel
    try:
        github.launcher(group).api.cancel(group.github_owner, group.github_repo, workflow_run_id)
    except GitHubError as exc:
        log.warning(
            "could not cancel workflow run %s: %s", workflow_run_id, exc.message,
            extra={"event": "dispatch.cancel_failed", "workflow_run_id": workflow_run_id, "permanent": exc.permanent},
        )  # fmt: skip
        return exc.permanent  # a refusal that will not change: release anyway; a transient one: next tick
    return True


def _runners(statement: str, params: dict[str, Any]) -> list[tuple[uuid.UUID, int | None, RunnerGroup]]:
    """A pass's (runner id, workflow run id, group) rows: ``statement`` answers runner id, workflow run id, group id."""
    with connection.cursor() as cur:
        cur.execute(statement, params)
        rows = cur.fetchall()
    groups = RunnerGroup.objects.in_bulk({row[2] for row in rows})
    return [(row[0], row[1], groups[row[2]]) for row in rows if row[2] in groups]


def release_pass(github: GitHub, *, now: datetime, limit: int = RELEASE_BATCH) -> int:
    """Cancel the workflow runs of runners that can never accept, and delete those runners; answers how many."""
    released = 0
    for runner_id, workflow_run_id, group in _runners(sql.RELEASABLE, {"now": now, "limit": limit}):
        if not cancel_quietly(github, group, workflow_run_id):
            continue
        if services.github_runner_release(runner_id=runner_id, now=now):
            released += 1
            log.info(
                "released runner %s (its run no longer waits for it); workflow run %s cancelled", runner_id,
                workflow_run_id, extra={"event": "dispatch.released", "runner_id": str(runner_id),
                                        "workflow_run_id": workflow_run_id},
            )  # fmt: skip
    return released


def cancel_overdue_pass(github: GitHub, *, now: datetime, limit: int = RELEASE_BATCH) -> int:
    """Cancel the workflow runs of runs whose cancellation their runner has not carried out in time.

    The reconcile pass then sees the workflow run ended and settles the run
    as cancelled. Each workflow run is cancelled once per process.
    """
    cancelled = 0
    for runner_id, workflow_run_id, group in _runners(
        sql.OVERDUE_CANCELS, {"before": now - CANCEL_GRACE, "limit": limit}
    ):
        # (the statement selects only runners with a workflow run id)
        if workflow_run_id is None or workflow_run_id in github.cancelled:
            continue
        if cancel_quietly(github, group, workflow_run_id):
            github.cancelled.add(workflow_run_id)
            cancelled += 1
            log.warning(
                "runner %s did not stop its cancelled run in time; workflow run %s cancelled", runner_id,
                workflow_run_id, extra={"event": "dispatch.cancel_overdue", "runner_id": str(runner_id),
                                        "workflow_run_id": workflow_run_id},
            )  # fmt: skip
    return cancelled


def reconcile_pass(github: GitHub, *, now: datetime) -> int:
    """Fail the runs whose workflow run ended without ``done``; answers how many runners it settled."""
    with connection.cursor() as cur:
        cur.execute(sql.LIVE_DISPATCHES, {"limit": RECONCILE_RUNNERS})
        rows = cur.fetchall()
    live: dict[int, dict[int, uuid.UUID]] = defaultdict(dict)  # group → workflow run id → runner
    since: dict[int, datetime] = {}
    for group_id, runner_id, workflow_run_id, dispatched_at in rows:
        live[group_id][int(workflow_run_id)] = runner_id
        since.setdefault(group_id, dispatched_at)  # rows come oldest first
    due = [g for g in live if github.reconcile_due(g)][:RECONCILE_GROUPS]
    groups = RunnerGroup.objects.in_bulk(due)
    settled = 0
    for group_id in due:
        group = groups.get(group_id)
        if group is None:
            continue
        listing = github.api.workflow_runs(
            group.github_owner, group.github_repo, group.github_workflow, created_since=since[group_id],
            status="completed", max_pages=RECONCILE_PAGES,
        )  # fmt: skip
        try:
            ended = [run for run in listing if run.id in live[group_id]]
        except GitHubError as exc:
            log.warning(
                "could not list the workflow runs of group %s: %s", group_id, exc.message,
                extra={"event": "dispatch.reconcile_failed", "runner_group_id": group_id},
            )  # fmt: skip
            continue
        github.reconciled(group_id)
        for run in ended:
            if _settle(live[group_id][run.id], run.id, run.conclusion, now=now):
                settled += 1
    return settled


def _settle(runner_id: uuid.UUID, workflow_run_id: int, conclusion: str, *, now: datetime) -> bool:
    outcome = services.github_workflow_run_ended(
        runner_id=runner_id, workflow_run_id=workflow_run_id, conclusion=conclusion, now=now
    )
    if outcome is None:
        return False  # gone meanwhile, or another dispatcher is settling it
    if outcome.run_id is not None and outcome.started:
        try:
            flush_live_log(outcome.run_id)
        except Exception:
            # The run is failed; the runner stays, so the next pass flushes again before deleting it.
            log.warning(
                "live-log flush failed; retried next pass", exc_info=True,
                extra={"event": "dispatch.flush_failed", "run_id": str(outcome.run_id)},
            )  # fmt: skip
            return True
    log.warning(
        "workflow run %s ended (%s) without its runner reporting done", workflow_run_id, conclusion,
        extra={"event": "dispatch.workflow_ended", "runner_id": str(runner_id), "workflow_run_id": workflow_run_id,
               "run_id": str(outcome.run_id) if outcome.run_id else None},
    )  # fmt: skip
    services.github_runner_release(runner_id=runner_id, now=now)
    return True
