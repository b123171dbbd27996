"""The subset of GitHub's REST API the GitHub Actions launcher uses, through githubkit.

Calls: ``POST /repos/{owner}/{repo}/actions/workflows/{workflow}/dispatches``
(with ``return_run_details``), ``GET .../workflows/{workflow}`` (a workflow id's
file), ``GET .../workflows/{workflow}/runs`` (the correlation lookup and the
reconcile), ``GET /repos/{owner}/{repo}/actions/runs/{id}`` and
``POST .../runs/{id}/cancel``; in App mode also ``GET
/repos/{owner}/{repo}/installation`` and ``POST
/app/installations/{id}/access_tokens``.

Why githubkit (docs/github-actions.md, "The client library"): it is
maintained, generated from GitHub's own OpenAPI description (it already knows
``return_run_details``), signs the App's JWT with pyjwt (RS256), caches each
installation's access token until a minute before it expires, takes any base
URL (GitHub Enterprise Server), and classifies rate limits (``Retry-After``,
``x-ratelimit-reset``) into exceptions. Its automatic retries are off: the
dispatcher decides when to try again (within the claim's lease), so a retry
never blocks a dispatcher tick in a sleep. Answers are read as JSON for the
few fields used, not through the generated models: those require every field
of the full repository object, and a GitHub Enterprise Server older than the
description omits some, which must not turn into a failed dispatch.

Errors come out as :class:`GitHubError`: ``permanent`` for GitHub's
definitive refusals (404 workflow or repository, 422 bad inputs, 403 missing
permission, 401 refused credentials), transient otherwise (5xx, rate limits,
network), with ``retry_after`` seconds when GitHub said when to come back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

import httpx
from githubkit import AppAuthStrategy, GitHub, TokenAuthStrategy
from githubkit.cache import MemCacheStrategy
from githubkit.exception import RateLimitExceeded, RequestError, RequestFailed, RequestTimeout

T = TypeVar("T")

# How long a repository's App installation id is believed before it is asked
# again (an App can be uninstalled and reinstalled, which changes the id).
INSTALLATION_TTL = 3600.0
# The REST API version asked for: GitHub's long-standing one, which every
# supported GitHub Enterprise Server knows (a newer version header is a 400
# there) and whose description has return_run_details.
API_VERSION: Literal["2022-11-28"] = "2022-11-28"
# Per request: GitHub answers within a second or two; a hung connection must
# not hold a dispatcher tick for long.
REQUEST_TIMEOUT = 20.0
USER_AGENT = "gantry-dispatcher"


class GitHubError(Exception):
    """GitHub refused or could not answer a call. ``permanent``: asking again cannot help."""

    def __init__(self, message: str, *, status: int = 0, permanent: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.permanent = permanent
        self.retry_after = retry_after


@dataclass(frozen=True)
class Dispatched:
    """What a workflow dispatch answered: the run's id and page, when GitHub said (``return_run_details``)."""

    workflow_run_id: int | None
    html_url: str


@dataclass(frozen=True)
class WorkflowRun:
    id: int
    status: str  # queued, in_progress, completed, ...
    conclusion: str  # success, failure, cancelled, ... ("" until completed)
    html_url: str
    display_title: str
    created_at: str


def _message(body: Any, fallback: str) -> str:
    if isinstance(body, dict) and body.get("message"):
        text = str(body["message"])
        errors = body.get("errors")
        if isinstance(errors, list) and errors:
            text += ": " + "; ".join(str(e.get("message", e) if isinstance(e, dict) else e) for e in errors)
        return text
    return fallback


def _retry_after(headers: httpx.Headers) -> float | None:
    raw = headers.get("retry-after")
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            return None
    reset = headers.get("x-ratelimit-reset")
    if reset and headers.get("x-ratelimit-remaining") == "0":
        try:
            return max(0.0, float(reset) - time.time())
        except ValueError:
            return None
    return None


def translate(exc: Exception, what: str) -> GitHubError:
    """A githubkit exception as a :class:`GitHubError` (permanent or not, and when to retry)."""
    if isinstance(exc, RateLimitExceeded):
        return GitHubError(
            f"{what}: GitHub rate limit exceeded", status=exc.response.status_code,
            retry_after=exc.retry_after.total_seconds(),
        )  # fmt: skip
    if isinstance(exc, RequestFailed):
        status = exc.response.status_code
        try:
            body = exc.response.json()
        except ValueError:
            body = None
        text = f"{what}: GitHub answered {status}: {_message(body, exc.response.raw_response.reason_phrase)}"
        if status == 429 or status >= 500:
            return GitHubError(text, status=status, retry_after=_retry_after(exc.response.headers))
        return GitHubError(text, status=status, permanent=True)
    if isinstance(exc, RequestTimeout):
        return GitHubError(f"{what}: GitHub did not answer in time")
    if isinstance(exc, RequestError):
        return GitHubError(f"{what}: GitHub could not be reached: {exc.exc!r}")
    raise exc


class GitHubApi:
    """One installation's view of GitHub: a token, or a GitHub App whose installation is found per repository.

    Thread-safe for the dispatcher's use (one thread); the caches are guarded anyway.
    """

    def __init__(
        self,
        *,
        api_url: str,
        token: str = "",
        app_id: str = "",
        app_private_key: str = "",
        timeout: float = REQUEST_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not token and not (app_id and app_private_key):
            raise ValueError("GitHubApi needs a token or a GitHub App id and private key")
        options: dict[str, Any] = {
            "base_url": api_url,
            "auto_retry": False,  # the dispatcher retries, within the claim's lease
            "http_cache": False,  # every answer must be fresh (run status, dispatch)
            "timeout": timeout,
            "user_agent": USER_AGENT,
            # This object's own cache of the App's JWT and installation tokens
            # (githubkit's default is process-wide and keyed by App id only).
            "cache_strategy": MemCacheStrategy(),
        }
        self.api_url = api_url
        self._clock = clock
        self._lock = threading.Lock()
        self._installations: dict[tuple[str, str], tuple[GitHub[Any], float]] = {}
        self._app: GitHub[Any] | None = None
        self._token: GitHub[Any] | None = None
        if app_id:
            self._app = GitHub(AppAuthStrategy(app_id, app_private_key), **options)
        else:
            self._token = GitHub(TokenAuthStrategy(token), **options)

    # ------------------------------------------------------------ credentials

    def _client(self, owner: str, repo: str) -> GitHub[Any]:
        """The client that acts on ``owner/repo``: the token, or the App's installation on that repository."""
        if self._token is not None:
            return self._token
        assert self._app is not None
        key = (owner.lower(), repo.lower())
        with self._lock:
            found = self._installations.get(key)
            if found is not None and found[1] > self._clock():
                return found[0]
        try:
            answer = self._app.rest(API_VERSION).apps.get_repo_installation(owner, repo).json()
        except Exception as exc:
            err = translate(exc, f"finding the GitHub App's installation on {owner}/{repo}")
            if err.status == 404:
                err.message = f"the GitHub App is not installed on {owner}/{repo} (GitHub answered 404)"
            raise err from exc
        app_auth = self._app.auth
        assert isinstance(app_auth, AppAuthStrategy)
        client = self._app.with_auth(app_auth.as_installation(int(answer["id"])))
        with self._lock:
            self._installations[key] = (client, self._clock() + INSTALLATION_TTL)
        return client

    def forget(self, owner: str, repo: str) -> None:
        """Drop the cached installation of ``owner/repo`` (after GitHub refused its credentials)."""
        with self._lock:
            self._installations.pop((owner.lower(), repo.lower()), None)

    def _call(self, owner: str, repo: str, what: str, call: Callable[[GitHub[Any]], T]) -> T:
        try:
            return call(self._client(owner, repo))
        except GitHubError:
            raise
        except Exception as exc:
            err = translate(exc, what)
            if err.status == 401:
                self.forget(owner, repo)  # a stale installation token; the next call asks afresh
            raise err from exc

    # ------------------------------------------------------------ calls

    def dispatch(
        self, owner: str, repo: str, workflow: str, *, ref: str, inputs: dict[str, str], return_run_details: bool
    ) -> Dispatched:
        """``workflow_dispatch``; with ``return_run_details`` GitHub answers the new run's id (200) instead of 204."""
        workflow_id: int | str = int(workflow) if workflow.isdigit() else workflow
        extra: dict[str, Any] = {"return_run_details": True} if return_run_details else {}

        def call(gh: GitHub[Any]) -> Any:
            return gh.rest(API_VERSION).actions.create_workflow_dispatch(
                owner, repo, workflow_id, ref=ref, inputs=inputs, **extra
            )

        resp = self._call(owner, repo, f"dispatching {owner}/{repo} {workflow} at {ref}", call)
        body = resp.json() if resp.status_code == 200 and resp.raw_response.content else None
        if isinstance(body, dict) and body.get("workflow_run_id"):
            return Dispatched(int(body["workflow_run_id"]), str(body.get("html_url") or ""))
        return Dispatched(None, "")

    def workflow_path(self, owner: str, repo: str, workflow: str) -> str:
        """The file of a workflow named by id (``.github/workflows/x.yml``); a file name maps to it directly."""
        if not workflow.isdigit():
            return f".github/workflows/{workflow}"
        answer = self._call(
            owner, repo, f"reading workflow {workflow} of {owner}/{repo}",
            lambda gh: gh.rest(API_VERSION).actions.get_workflow(owner, repo, int(workflow)).json(),
        )  # fmt: skip
        return str(answer["path"])

    def workflow_runs(
        self, owner: str, repo: str, workflow: str, *, created_since: datetime, status: str = "", max_pages: int = 2
    ) -> Iterator[WorkflowRun]:
        """The workflow's ``workflow_dispatch`` runs created since ``created_since``, newest first, at most
        ``max_pages`` pages of 100: a bounded listing, whatever the repository's history."""
        workflow_id: int | str = int(workflow) if workflow.isdigit() else workflow
        since = (created_since - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        extra: dict[str, Any] = {"status": status} if status else {}
        for page in range(1, max_pages + 1):

            def call(gh: GitHub[Any], page: int = page) -> Any:
                return gh.rest(API_VERSION).actions.list_workflow_runs(
                    owner, repo, workflow_id, event="workflow_dispatch", created=f">={since}",
                    per_page=100, page=page, exclude_pull_requests=True, **extra,
                ).json()  # fmt: skip

            answer = self._call(owner, repo, f"listing the runs of {owner}/{repo} {workflow}", call)
            runs = answer.get("workflow_runs") or []
            for item in runs:
                yield _run(item)
            if len(runs) < 100:
                return

    def workflow_run(self, owner: str, repo: str, run_id: int) -> WorkflowRun:
        answer = self._call(
            owner, repo, f"reading workflow run {run_id} of {owner}/{repo}",
            lambda gh: gh.rest(API_VERSION).actions.get_workflow_run(owner, repo, run_id).json(),
        )  # fmt: skip
        return _run(dict(answer))

    def cancel(self, owner: str, repo: str, run_id: int) -> bool:
        """Cancel a workflow run; False when it has already finished (GitHub's 409), which is no failure."""
        try:
            self._call(
                owner, repo, f"cancelling workflow run {run_id} of {owner}/{repo}",
                lambda gh: gh.rest(API_VERSION).actions.cancel_workflow_run(owner, repo, run_id),
            )  # fmt: skip
        except GitHubError as exc:
            if exc.status in (404, 409):
                return False  # finished, or gone: nothing left to stop
            raise
        return True


def _run(item: Mapping[str, Any]) -> WorkflowRun:
    return WorkflowRun(
        id=int(item["id"]),
        status=str(item.get("status") or ""),
        conclusion=str(item.get("conclusion") or ""),
        html_url=str(item.get("html_url") or ""),
        display_title=str(item.get("display_title") or item.get("name") or ""),
        created_at=str(item.get("created_at") or ""),
    )
