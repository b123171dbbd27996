"""One error tree for the whole service, and the registry of every ``code`` the API can answer.

Each error class carries its machine ``code`` (part of the contract), its HTTP
status, its log level and any extra headers; an instance adds the ``detail``
sentence and extra fields. ``gantry.api.errors.exception_handler`` renders
them as ``{"code", "detail", ...}``; DRF's own exceptions (bad JSON, a missing
credential, a wrong method) are mapped onto the classes here, so this module
declares every code once. Services raise these; views never build error
responses by hand.

The registry is the class tree itself: :func:`registry` walks it, and the
table of codes in ``docs/api.md`` is generated from it
(``python manage.py error_codes``; a test fails when the two differ). A class's
docstring says, in one line, when the code is answered: that line is the
table's "when" column.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from django import db

# The database down or restarting (a connection refused or terminated): expected weather for a
# caller that can try again, said in one line, not a bug's traceback.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (db.OperationalError, db.InterfaceError)


class GantryError(Exception):
    """Any refusal of Gantry's (the base; not answered as such)."""

    code: ClassVar[str] = "error"
    http_status: ClassVar[int] = 400
    # Most refusals are a client arriving too late or asking wrongly: worth a
    # warning, not an error. Benign ones (BenignConflict) log at INFO.
    log_level: ClassVar[int] = logging.WARNING

    def __init__(self, detail: str, *, retry_after: int | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        # Seconds a client should wait before trying again: the Retry-After header.
        self.retry_after = retry_after
        self.extra = extra

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "detail": self.detail}
        body.update(self.extra)
        return body

    def headers(self) -> dict[str, str]:
        """Extra response headers this refusal carries."""
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


# ---------------------------------------------------------------- 400


class InvalidRequest(GantryError):
    """A field is missing, of the wrong type, out of range, or breaks a rule (labels, spec, secrets)."""

    code = "invalid_request"
    http_status = 400


class WebhookUrlForbidden(InvalidRequest):
    """A webhook URL resolves to a private, loopback or link-local address (GANTRY_WEBHOOK_ALLOW_PRIVATE unset)."""

    code = "webhook_url_forbidden"
    http_status = 400


class InvalidJson(InvalidRequest):
    """The body is not JSON."""

    code = "invalid_json"


# ---------------------------------------------------------------- 401


class NotAuthenticated(GantryError):
    """No credentials."""

    code = "not_authenticated"
    http_status = 401


class AuthenticationFailed(NotAuthenticated):
    """A forged, expired, revoked, malformed or unknown-audience token; a runner token whose runner is gone."""

    code = "authentication_failed"


class OidcTokenInvalid(NotAuthenticated):
    """An OIDC exchange whose token fails verification: malformed, unknown signing key, bad signature, wrong issuer
    or audience, expired."""

    code = "oidc_token_invalid"


class UploadUrlInvalid(NotAuthenticated):
    """A forged or expired log upload URL (Gantry's own, when no S3 bucket is configured)."""

    code = "upload_url_invalid"


# ---------------------------------------------------------------- 403


class Forbidden(GantryError):
    """A valid credential of the wrong kind or role: a group or runner JWT on a user route, a member doing an
    admin call, a non-superuser setting the rate."""

    code = "forbidden"
    http_status = 403


class SpecOverrideForbidden(Forbidden):
    """A member queued a deployment with a spec of its own: overriding a stack's spec needs the org admin role
    (the stack's secrets reach the steps)."""

    code = "spec_override_forbidden"


class PriorityForbidden(Forbidden):
    """A member queued a deployment with priority high, or changed a waiting run's priority: both need the org
    admin role."""

    code = "priority_forbidden"


class RunBinding(Forbidden):
    """A runner token used on another run's or another runner's path (the run binding)."""

    code = "run_binding"


class OidcClaimsMismatch(Forbidden):
    """An OIDC exchange whose valid token names another repository, workflow or workflow run than the runner's
    dispatch (or a runner that is not a github_actions group's)."""

    code = "oidc_claims_mismatch"


class OidcExchangeUsed(Forbidden):
    """A second OIDC exchange for a runner: each exchange works once."""

    code = "oidc_exchange_used"


class BackendDispatchedGroup(Forbidden):
    """A poll by a github_actions group's token: Gantry's backend dispatcher serves those groups."""

    code = "backend_dispatched_group"


# ---------------------------------------------------------------- 404 and other client errors


class NotFound(GantryError):
    """No such object, or an object of an org the caller is not a member of (existence never leaks)."""

    code = "not_found"
    http_status = 404


class MethodNotAllowed(GantryError):
    """The route does not take this HTTP method."""

    code = "method_not_allowed"
    http_status = 405


class NotAcceptable(GantryError):
    """The route cannot answer in a media type the Accept header allows."""

    code = "not_acceptable"
    http_status = 406


class BodyTooLarge(GantryError):
    """The request body is over the limit (DATA_UPLOAD_MAX_MEMORY_SIZE, 4 MiB): nothing was read or changed."""

    code = "body_too_large"
    http_status = 413


class UnsupportedMediaType(GantryError):
    """The body's Content-Type is not one the route reads (JSON, for all but the log upload)."""

    code = "unsupported_media_type"
    http_status = 415


class ServiceUnavailable(GantryError):
    """A dependency (the database) is not answering; try again after the Retry-After header's seconds."""

    code = "service_unavailable"
    http_status = 503


# ---------------------------------------------------------------- 409


class Conflict(GantryError):
    """The object's current state refuses the request; `detail` names the cause (the uncoded 409s of accept:
    lease expired and reset, reassigned, lease past expiry, failure, startup_timeout)."""

    code = "conflict"
    http_status = 409


class BenignConflict(Conflict):
    """A conflict that is the outcome of someone's decision, not a fault: logged at INFO, not WARNING."""

    log_level = logging.INFO


class InvalidTransition(Conflict):
    """The run is not in a state the transition starts from."""

    code = "invalid_transition"


class RunTerminal(Conflict):
    """The run has finished; a finished run never changes."""

    code = "run_terminal"


class RunAlreadyTerminal(BenignConflict):
    """Accept of a run discarded or cancelled while its runner booted: benign, the runner exits 0."""

    code = "run_already_terminal"


class AcceptResponseUndeliverable(Conflict):
    """A second accept from the runner that already accepted: the first answer was lost, the run is failed."""

    code = "accept_response_undeliverable"


class NotSkippable(Conflict):
    """Skip of a deployment whose run has started."""

    code = "not_skippable"


class NotRetryable(Conflict):
    """Retry of a deployment whose run did not fail, time out or get cancelled."""

    code = "not_retryable"


class SlugTaken(Conflict):
    """An organization with this slug exists."""

    code = "slug_taken"


class NameTaken(Conflict):
    """A runner group or stack of this name exists in the organization."""

    code = "name_taken"


class AccountClaimed(Conflict):
    """Re-issuing a set-password link for a user who has set a password already (a super-admin resets those)."""

    code = "account_claimed"


class LastAdmin(Conflict):
    """Removing or demoting an org's last admin (a membership with the admin role): the org would have nobody
    to manage it."""

    code = "last_admin"


class StackBusy(Conflict):
    """Archive of a stack that holds a claimed or executing run (assigned, running, stopping): cancel it or let it
    finish first."""

    code = "stack_busy"


class RunNotWaiting(Conflict):
    """A change of priority for a run no longer waiting for a runner (claimed, running or finished): its place in
    the queue is behind it."""

    code = "run_not_waiting"


class IdempotencyKeyReused(GantryError):
    """An Idempotency-Key already used on this stack for a different request (another spec, or another user):
    the key names one request; use a new key for a new one."""

    code = "idempotency_key_reused"
    http_status = 422


class StackArchived(Conflict):
    """A deployment, retry or change of an archived stack: it takes no new work (its history stays readable)."""

    code = "stack_archived"


class RunnerBusy(Conflict):
    """Ready from a runner that has already accepted its run."""

    code = "runner_busy"


class RunnerHoldsRun(Conflict):
    """Deregister of a runner that still holds a run (executing it, or assigned with an unexpired lease)."""

    code = "runner_holds_run"


class RunnerNotOffline(Conflict):
    """Force-delete of a runner seen more recently than GANTRY_RUNNER_FORCE_GATE ago (`eligible_at` says when)."""

    code = "runner_not_offline"


class GroupBusy(Conflict):
    """Archiving a runner group while one of its runners holds a run (assigned or executing)."""

    code = "group_busy"


class ChunkExists(Conflict):
    """A sealed log chunk is already stored with other bytes."""

    code = "chunk_exists"


# ---------------------------------------------------------------- the registry


def registry() -> list[type[GantryError]]:
    """Every error class that answers a code, in declaration order, the base excepted.

    A code belongs to exactly one class: two classes declaring one code would
    make the contract ambiguous, so that is refused here (and by the test that
    renders the table).
    """
    seen: dict[str, type[GantryError]] = {}
    stack: list[type[GantryError]] = [GantryError]
    while stack:
        cls = stack.pop(0)
        for sub in cls.__subclasses__():
            stack.append(sub)
            if sub.code == cls.code:
                continue  # inherits its parent's code (BenignConflict): not a code of its own
            other = seen.get(sub.code)
            if other is not None and other is not sub:
                raise TypeError(f"error code {sub.code!r} is declared by both {other.__name__} and {sub.__name__}")
            seen[sub.code] = sub
    return sorted(seen.values(), key=lambda c: (c.http_status, c.code))


def markdown_table() -> str:
    """The table of error codes for docs/api.md, one row per code."""
    rows = ["| status | code | when |", "|---|---|---|"]
    for cls in registry():
        when = " ".join((cls.__doc__ or "").split("\n\n", 1)[0].split())
        rows.append(f"| {cls.http_status} | `{cls.code}` | {when} |")
    return "\n".join(rows) + "\n"
