"""The GitHub Actions launcher: each runner is a workflow run started by ``workflow_dispatch``.

Used by Gantry's backend dispatcher (``gantry/dispatch/dispatcher.py``), not by
a coordinator: for github_actions groups the poll is driven by the backend. A
launch dispatches the group's workflow (``gantry-runner.yml`` beside this
file is the template) with three inputs, ``gantry_url``, ``run_id`` and
``runner_id``, and asks GitHub for the new run's id (``return_run_details``).
No credential travels in the inputs (they are visible to anyone who can read
the repository's Actions): the workflow gets its runner token by exchanging a
GitHub OIDC token at Gantry (``POST /api/v1/runners/{id}/oidc-exchange``),
which checks the token names this repository, this workflow file and the run
id recorded here.

Where GitHub answers no run id (a GitHub Enterprise Server that refuses or
ignores ``return_run_details``), the dispatch carries a fourth input,
``correlation``, a random one-time value; the template puts it in the run's
name, so the run is found by listing the workflow's recent runs, and the
runner presents it at the exchange until the run id is known.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from launchers import register
from launchers.base import Assignment, Launcher, LaunchError, WorkerHandle
from launchers.github_actions.api import GitHubApi, GitHubError, WorkflowRun

log = logging.getLogger("gantry.launcher.github_actions")

# The correlation lookup right after a dispatch without run details: GitHub
# lists a new run within a second or two. Bounded, so a run that never shows
# costs the dispatcher a few seconds, once.
LOOKUP_ATTEMPTS = 5
LOOKUP_PAUSE = 1.0

# API roots that answered a dispatch without a run id: from then on their
# dispatches carry a correlation input at once (per process; a restart asks again).
_no_run_details: set[str] = set()
_no_run_details_lock = threading.Lock()
# Workflow ids resolved to their file, per (api, owner, repo, workflow).
_paths: dict[tuple[str, str, str, str], str] = {}


def _refuses_run_details(exc: GitHubError) -> bool:
    return exc.status == 422 and "return_run_details" in exc.message


def as_launch_error(exc: GitHubError) -> LaunchError:
    return LaunchError(exc.message, permanent=exc.permanent, retry_after=exc.retry_after)


@register("github_actions")
class GitHubActionsLauncher(Launcher):
    """One github_actions group's launcher: its repository, workflow and ref, and the instance's GitHub access."""

    def __init__(
        self,
        *,
        api: GitHubApi,
        owner: str,
        repo: str,
        workflow: str,
        ref: str,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api = api
        self.owner = owner
        self.repo = repo
        self.workflow = workflow
        self.ref = ref
        self._sleep = sleep

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, state_dir: Path) -> Launcher:
        raise ValueError(
            "the github_actions launcher runs inside Gantry's backend dispatcher (manage.py dispatcher), "
            "not in a coordinator: create a github_actions runner group instead (docs/github-actions.md)"
        )

    def workflow_path(self) -> str:
        key = (self.api.api_url, self.owner.lower(), self.repo.lower(), self.workflow)
        if key not in _paths:
            _paths[key] = self.api.workflow_path(self.owner, self.repo, self.workflow)
        return _paths[key]

    def launch(self, assignment: Assignment) -> WorkerHandle:
        """Dispatch the workflow for ``assignment``; the handle's ``meta`` says what to record.

        ``meta``: ``workflow_run_id`` (None if not found), ``html_url``,
        ``workflow_path``, and ``correlation`` (only without run details).
        """
        inputs = {"gantry_url": assignment.server, "run_id": assignment.run_id, "runner_id": assignment.runner_id}
        started = datetime.now(UTC)
        try:
            path = self.workflow_path()
            dispatched = None
            if self.api.api_url not in _no_run_details:
                try:
                    dispatched = self.api.dispatch(
                        self.owner, self.repo, self.workflow, ref=self.ref, inputs=inputs, return_run_details=True
                    )
                except GitHubError as exc:
                    if not _refuses_run_details(exc):
                        raise
                    self._remember_no_run_details("refused")
                else:
                    if dispatched.workflow_run_id is None:
                        # Accepted, but no run id came back (the parameter was
                        # ignored): find this one by its runner id, which the
                        # template also puts in the run's name.
                        self._remember_no_run_details("ignored")
                        found = self._lookup(assignment.runner_id, started)
                        return self._handle(assignment, path, found, correlation="")
            if dispatched is not None:
                return self._handle(assignment, path, (dispatched.workflow_run_id, dispatched.html_url), correlation="")
            correlation = secrets.token_urlsafe(18)
            self.api.dispatch(
                self.owner, self.repo, self.workflow, ref=self.ref, inputs={**inputs, "correlation": correlation},
                return_run_details=False,
            )  # fmt: skip
            found = self._lookup(correlation, started)
        except GitHubError as exc:
            raise as_launch_error(exc) from exc
        return self._handle(assignment, path, found, correlation=correlation)

    def _remember_no_run_details(self, how: str) -> None:
        with _no_run_details_lock:
            _no_run_details.add(self.api.api_url)
        log.info(
            "GitHub %s return_run_details; dispatches carry a correlation input from now on", how,
            extra={"event": "github.no_run_details", "api_url": self.api.api_url},
        )  # fmt: skip

    def _lookup(self, needle: str, since: datetime) -> tuple[int | None, str]:
        """The dispatched run, found by the value in its name; (None, "") if it does not show in time."""
        for attempt in range(LOOKUP_ATTEMPTS):
            for run in self.api.workflow_runs(self.owner, self.repo, self.workflow, created_since=since, max_pages=1):
                if needle in run.display_title:
                    return run.id, run.html_url
            if attempt + 1 < LOOKUP_ATTEMPTS:
                self._sleep(LOOKUP_PAUSE)
        return None, ""

    def _handle(
        self, assignment: Assignment, path: str, found: tuple[int | None, str], *, correlation: str
    ) -> WorkerHandle:
        run_id, html_url = found
        return WorkerHandle(
            kind=self.kind,
            run_id=assignment.run_id,
            runner_id=assignment.runner_id,
            ident=str(run_id or ""),
            started_at=time.time(),
            meta={"workflow_run_id": run_id, "html_url": html_url, "workflow_path": path, "correlation": correlation},
        )

    # ------------------------------------------------------------ the rest of the interface

    def discover(self) -> list[WorkerHandle]:
        # Gantry's database is the record of what was dispatched (the runner
        # rows); the dispatcher reconciles them against GitHub's listing.
        return []

    def is_alive(self, handle: WorkerHandle) -> bool:
        if not handle.ident:
            return True  # not found yet: assume it runs (the reapers bound it)
        try:
            return self.run(int(handle.ident)).status != "completed"
        except GitHubError:
            return True  # can't tell: never declare a worker dead on a failed read

    def run(self, workflow_run_id: int) -> WorkflowRun:
        return self.api.workflow_run(self.owner, self.repo, workflow_run_id)

    def terminate(self, handle: WorkerHandle, grace: float = 10.0) -> None:
        if handle.ident:
            try:
                self.api.cancel(self.owner, self.repo, int(handle.ident))
            except GitHubError as exc:
                raise as_launch_error(exc) from exc
