"""Gantry's domain model (docs/design.md §2).

Writes to these tables go through ``gantry.core.services``; models carry no
state-changing methods. Invariants that must hold under concurrency are
enforced by the database (see ``Meta.constraints`` and the hand-written SQL in
the migrations), not by the code that usually keeps them.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Lower, Now


class Role(models.TextChoices):
    ADMIN = "admin"
    MEMBER = "member"


class GroupKind(models.TextChoices):
    SELF_HOSTED = "self_hosted"
    GITHUB_ACTIONS = "github_actions"


class RunnerStatus(models.TextChoices):
    NOT_READY = "not_ready"
    READY = "ready"
    BUSY = "busy"


class DeploymentStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


class Priority(models.IntegerChoices):
    """A run's priority: higher goes first in the claim, and a waiting run ages upwards (docs/queue.md).

    Stored as a smallint so the claim's index orders by it; the API and the
    pages speak the labels. ``gantry.sql.claim.effective_priority`` is the one
    place that says how a waiting run ages.
    """

    LOW = 0, "low"
    NORMAL = 1, "normal"
    HIGH = 2, "high"

    @classmethod
    def named(cls, name: str) -> Priority | None:
        """The priority called ``name`` (``low``, ``normal``, ``high``), or None."""
        return next((p for p in cls if p.label == name), None)


# The names the API and the pages speak, lowest first.
PRIORITY_NAMES: tuple[str, ...] = tuple(p.label for p in Priority)


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    PENDING = "pending"
    ASSIGNED = "assigned"
    RUNNING = "running"
    REQUESTED_CANCELLATION = "requested_cancellation"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    DISCARDED = "discarded"
    STARTUP_TIMEOUT = "startup_timeout"


# Named sets of run states, used by services, indexes and reapers alike.
TERMINAL = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILURE, RunStatus.CANCELLED, RunStatus.DISCARDED, RunStatus.STARTUP_TIMEOUT}
)
# The run that holds its stack's lane: at most one per stack (a partial unique index).
LANE_HOLDERS = frozenset(
    {
        RunStatus.PENDING,
        RunStatus.ASSIGNED,
        RunStatus.RUNNING,
        RunStatus.REQUESTED_CANCELLATION,
        RunStatus.CANCELLING,
    }
)
# States in which a run occupies its runner: at most one such run per runner.
RUNNER_BOUND = frozenset(
    {RunStatus.ASSIGNED, RunStatus.RUNNING, RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING}
)
# Started and not finished: the runner is executing (or stopping) it.
EXECUTING = frozenset({RunStatus.RUNNING, RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING})
NEVER_STARTED = frozenset({RunStatus.QUEUED, RunStatus.PENDING, RunStatus.ASSIGNED})
# A run its user asked to stop, whose runner has not finished stopping it.
STOPPING = frozenset({RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING})
# The runs the queue page lists as waiting: never started (the same set, named for its use).
WAITING = NEVER_STARTED
# A run's phases (docs/api.md, "A run's timings"): each is the seconds from the first column to the
# second, null until both are known. The run answer (gantry.core.services.runs.run_timings) and a
# webhook's body (gantry.sql.runs.webhook_run_json) are both built from this table.
RUN_PHASES: dict[str, tuple[str, str]] = {
    # Its turn in the claim's line: first pending (time queued behind its stack's lane is not in it) -> first claimed.
    "wait_seconds": ("first_pending_at", "first_claimed_at"),
    # The start: first claimed -> accepted (a lease that lapsed on the way counts in it).
    "start_seconds": ("first_claimed_at", "started_at"),
    "first_output_seconds": ("started_at", "first_output_at"),
    "run_seconds": ("started_at", "finished_at"),
}
# Waiting and not claimed: a run whose priority may still change (docs/queue.md).
UNCLAIMED = frozenset({RunStatus.QUEUED, RunStatus.PENDING})

# Runner states before its accept: the claim's stub, and the runner booted from
# it (the stub reaper's partial index, runner_stub_created_idx).
RUNNER_NOT_ACCEPTED = frozenset({RunnerStatus.NOT_READY, RunnerStatus.READY})

# A deployment's status follows its newest run.
DEPLOYMENT_STATUS_FOR_RUN: dict[str, str] = {
    RunStatus.QUEUED: DeploymentStatus.QUEUED,
    RunStatus.PENDING: DeploymentStatus.QUEUED,
    RunStatus.ASSIGNED: DeploymentStatus.QUEUED,
    RunStatus.RUNNING: DeploymentStatus.RUNNING,
    RunStatus.REQUESTED_CANCELLATION: DeploymentStatus.RUNNING,
    RunStatus.CANCELLING: DeploymentStatus.RUNNING,
    RunStatus.SUCCEEDED: DeploymentStatus.SUCCEEDED,
    RunStatus.FAILURE: DeploymentStatus.FAILED,
    RunStatus.STARTUP_TIMEOUT: DeploymentStatus.FAILED,
    RunStatus.CANCELLED: DeploymentStatus.CANCELLED,
    RunStatus.DISCARDED: DeploymentStatus.SKIPPED,
}

# Stack label keys under this prefix (prefix stripped) form a run's selector.
SELECTOR_PREFIX = "gantry:runner-group:"
# Keys under "gantry:" are reserved for the system.
RESERVED_PREFIX = "gantry:"


def _in(field: str, states: frozenset[RunStatus]) -> Q:
    return Q(**{f"{field}__in": sorted(states)})


class Organization(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # The database holds the default, so orgs created by any writer start at
    # 2/h; changing it moves only orgs created afterwards (never backfilled).
    runs_per_hour_limit = models.PositiveIntegerField(default=2, db_default=2)
    dispatch_throttled_until = models.DateTimeField(null=True, blank=True)
    default_runner_group = models.ForeignKey(
        "RunnerGroup", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "organization"
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "membership"
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="membership_user_org_uniq")]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"


class Invitation(models.Model):
    """An org's offer of a role to an existing user, pending until that user accepts or declines it.

    Attaching someone who already has an account never happens without their
    consent (docs/api.md, "Members"); a user created by the org gets a
    membership at once instead. Accepting creates the membership and deletes
    the invitation; declining deletes it.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invitations")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "invitation"
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="invitation_user_org_uniq")]

    def __str__(self) -> str:
        return f"{self.user} invited to {self.organization} ({self.role})"


class RunnerGroup(models.Model):
    # No index of its own: the unique (organization, lower(name)) index serves it.
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="runner_groups", db_index=False
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32, choices=GroupKind.choices, default=GroupKind.SELF_HOSTED)
    labels = models.JSONField(default=dict, blank=True)
    max_concurrent_runs = models.PositiveIntegerField(default=10)
    # The group's runner rows are its slots; this counts them. Kept by
    # triggers on runner (migrations 0003, 0008), so every insert and delete,
    # ORM or raw SQL, is counted; the claim counts its own stub in the same
    # write that stamps last_polled_at (Runner.claim_counted). The claim reads
    # it from the group row it locks, which is what makes the capacity check
    # exact under concurrent polls.
    runner_count = models.PositiveIntegerField(default=0, db_default=0, editable=False)
    # Part of every group JWT; bumping it revokes all tokens issued before.
    token_version = models.PositiveIntegerField(default=1)
    drained = models.BooleanField(default=False)
    last_dispatch_error = models.TextField(blank=True, default="")
    last_dispatch_error_at = models.DateTimeField(null=True, blank=True)
    last_polled_at = models.DateTimeField(null=True, blank=True)
    github_owner = models.CharField(max_length=100, blank=True, default="")
    github_repo = models.CharField(max_length=100, blank=True, default="")
    github_workflow = models.CharField(max_length=200, blank=True, default="")
    github_ref = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    # Set by runner_group_archive (DELETE /runner-groups/{id}): the group left
    # every list and the claim, its tokens were revoked; its runs stay readable.
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "runner_group"
        ordering = ["organization_id", "name"]
        # Unique within the org whatever the case ("Linux" and "linux" are one name to a person).
        # Live groups only (migration 0025): an archived group's name is free again, as a stack's is.
        constraints = [
            models.UniqueConstraint(
                F("organization"),
                Lower("name"),
                condition=Q(archived_at__isnull=True),
                name="runner_group_org_name_ci_uniq",
            )
        ]

    def __str__(self) -> str:
        # Titled by org slug (callers that list groups select_related the organization).
        return f"{self.organization.slug}/{self.name}"

    # Written only by set-based statements (claim, rotate, trigger, dispatch
    # errors). A plain save() of a form-loaded instance must never write back
    # stale copies: a stale token_version would undo a rotation.
    SYSTEM_FIELDS = frozenset(
        {"runner_count", "token_version", "last_polled_at", "last_dispatch_error", "last_dispatch_error_at",
         "archived_at"}
    )  # fmt: skip

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.name for f in self._meta.concrete_fields if not f.primary_key and f.name not in self.SYSTEM_FIELDS
            ]
        super().save(*args, **kwargs)


class Runner(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    # No index of its own: runner_group_status_idx (runner_group, status) serves it.
    runner_group = models.ForeignKey(RunnerGroup, on_delete=models.CASCADE, related_name="runners", db_index=False)
    status = models.CharField(max_length=16, choices=RunnerStatus.choices, default=RunnerStatus.NOT_READY)
    created_at = models.DateTimeField(db_default=Now())
    ready_at = models.DateTimeField(null=True, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    launcher = models.CharField(max_length=32, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    container_id = models.CharField(max_length=128, blank=True, default="")
    pod_name = models.CharField(max_length=253, blank=True, default="")
    workflow_run_id = models.BigIntegerField(null=True, blank=True)
    # github_actions runners (the backend dispatcher, docs/github-actions.md).
    # db_default on each: the claim's INSERT names only the stub's own columns.
    # When GitHub accepted the workflow dispatch; null while the dispatch is
    # still being tried (the dispatcher's passes leave such a runner alone).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    workflow_run_url = models.CharField(max_length=500, blank=True, default="", db_default="")
    # The workflow file dispatched (".github/workflows/x.yml"): the OIDC
    # exchange checks the token's workflow_ref against it.
    workflow_path = models.CharField(max_length=300, blank=True, default="", db_default="")
    # sha256 of the one-time correlation input, only when GitHub answered no
    # workflow run id (GitHub Enterprise Server without return_run_details).
    dispatch_correlation_sha256 = models.CharField(max_length=64, blank=True, default="", db_default="")
    # Set by the one OIDC exchange the runner gets: a replay is refused.
    oidc_exchanged_at = models.DateTimeField(null=True, blank=True)
    # True when the statement that inserted the row (the claim's stub) counted
    # it on its group itself; the insert trigger counts every other row
    # (migration 0008). Saves the claim a second write of its group's row.
    claim_counted = models.BooleanField(default=False, db_default=False, editable=False)

    class Meta:
        db_table = "runner"
        ordering = ["created_at"]
        indexes = [models.Index(fields=["runner_group", "status"], name="runner_group_status_idx")]

    def __str__(self) -> str:
        return str(self.id)


class Stack(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="stacks")
    name = models.CharField(max_length=100)
    labels = models.JSONField(default=dict, blank=True)
    # The default spec of the stack's deployments; null when deployments must bring their own.
    spec = models.JSONField(null=True, blank=True)
    secrets = models.JSONField(default=dict, blank=True)
    # The priority of a deployment that names none (docs/queue.md).
    default_priority = models.SmallIntegerField(
        choices=Priority.choices, default=Priority.NORMAL, db_default=Priority.NORMAL
    )
    created_at = models.DateTimeField(db_default=Now())
    # Set once by services.stack_archive: the stack leaves lists and takes no
    # deployment; its history stays readable. Never cleared (no unarchive).
    archived_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "stack"
        ordering = ["organization_id", "name"]
        # Among live stacks only: an archived stack's name may be taken again.
        constraints = [
            models.UniqueConstraint(
                F("organization"), Lower("name"), condition=Q(archived_at__isnull=True), name="stack_org_name_ci_uniq"
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def runner_selector(self) -> dict[str, Any]:
        return {k[len(SELECTOR_PREFIX) :]: v for k, v in self.labels.items() if k.startswith(SELECTOR_PREFIX)}


class Deployment(models.Model):
    stack = models.ForeignKey(Stack, on_delete=models.CASCADE, related_name="deployments")
    status = models.CharField(max_length=16, choices=DeploymentStatus.choices, default=DeploymentStatus.QUEUED)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    spec = models.JSONField(default=dict)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # The POST's Idempotency-Key header, if it sent one: a retry of the same POST answers this deployment.
    # NULL, not "": unkeyed rows stay out of the partial unique index, and the old release never names it.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True, editable=False)  # noqa: DJ001

    class Meta:
        db_table = "deployment"
        ordering = ["-created_at", "-id"]
        constraints = [
            # Built CONCURRENTLY by migration 0026; only keyed rows are in it.
            models.UniqueConstraint(
                fields=["stack", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="deployment_idempotency_uniq",
            )
        ]

    def __str__(self) -> str:
        return f"deployment {self.pk}"


class RunSelector(models.Model):
    """The distinct selectors of an org's runs.

    A poll matches ``selector <@ group.labels`` against this small table, then
    probes the pending-run index once per matching selector, so its cost follows
    the number of distinct selectors, never the backlog (docs/performance.md).
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="selectors")
    selector = models.JSONField(default=dict)

    class Meta:
        db_table = "run_selector"
        constraints = [models.UniqueConstraint(fields=["organization", "selector"], name="run_selector_org_uniq")]

    def __str__(self) -> str:
        return f"{self.organization_id}: {self.selector}"


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    # No index of its own: run_org_created_idx (organization, created_at, id) serves it.
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="runs", db_index=False)
    stack = models.ForeignKey(Stack, on_delete=models.CASCADE, related_name="runs")
    # No index of its own: the unique (deployment, attempt) index serves it,
    # and the latest attempt (a backward scan of it). Every index of run is
    # written by each claim, whose update of the run cannot be HOT.
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="runs", db_index=False)
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=32, choices=RunStatus.choices)
    # Its place in the claim's order (docs/queue.md); a retry keeps it, an admin may change it while it waits.
    priority = models.SmallIntegerField(choices=Priority.choices, default=Priority.NORMAL, db_default=Priority.NORMAL)
    runner_selector = models.JSONField(default=dict)
    selector = models.ForeignKey(RunSelector, on_delete=models.PROTECT, related_name="runs")
    # The one binding between a runner and its run. The database constraint is
    # ON DELETE SET NULL (migration 0002), so a deleted runner releases its run
    # on every path, including set-based deletes that bypass the ORM.
    assigned_runner = models.ForeignKey(
        Runner, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    assigned_at = models.DateTimeField(null=True, blank=True)
    assigned_expires_at = models.DateTimeField(null=True, blank=True)
    first_pending_at = models.DateTimeField(null=True, blank=True)
    # The run's phases (docs/performance.md, "A run's phases"): the first claim of it (a lapsed lease's
    # second claim keeps the first), and the first output its runner pushed. Queued is created_at,
    # accepted is started_at, finished is finished_at.
    first_claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    first_output_at = models.DateTimeField(null=True, blank=True, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_reason = models.TextField(blank=True, default="")
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    sealed_chunks = models.PositiveIntegerField(default=0)
    # The sealed log chunks as /done reported them, {"count": n, "sha256": [hex, ...]}
    # (or as the reaper's flush recorded them, with null for hashes it cannot
    # know). Null until then. The log reader trusts it for which chunks exist
    # and what they hash to (docs/logs.md).
    log_manifest = models.JSONField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "run"
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["stack"], condition=_in("status", LANE_HOLDERS), name="run_one_lane_holder_per_stack"
            ),
            models.UniqueConstraint(
                fields=["assigned_runner"], condition=_in("status", RUNNER_BOUND), name="run_one_per_runner"
            ),
            models.UniqueConstraint(fields=["deployment", "attempt"], name="run_deployment_attempt_uniq"),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
        ]
        indexes = [
            # The claim: one index head per (org, selector, priority), oldest
            # first (within one priority the oldest also has aged the most, so
            # each head is that slice's first in the claim's order). It holds
            # exactly the claimable runs: pending and bound to no live runner
            # (the FK nulls the pointer when the runner row goes).
            models.Index(
                fields=["organization", "selector", "priority", "first_pending_at", "id"],
                condition=Q(status=RunStatus.PENDING, assigned_runner__isnull=True),
                name="run_claim_order_idx",
            ),
            # PromoteNextOnStack: the oldest queued run of a stack.
            models.Index(
                fields=["stack", "created_at", "id"],
                condition=Q(status=RunStatus.QUEUED),
                name="run_queued_stack_idx",
            ),
            # The queue read (gantry.dispatch.queue): an org's waiting runs, oldest
            # first, one index range per status merged in order; and capped counts
            # per status for /metrics. Finished history never enters it.
            models.Index(
                fields=["organization", "status", "created_at", "id"],
                condition=_in("status", WAITING),
                name="run_waiting_idx",
            ),
            # An org's runs newest first (GET /orgs/{org}/runs, the queue page's
            # history); it also serves the organization foreign key.
            models.Index(fields=["organization", "created_at", "id"], name="run_org_created_idx"),
        ]

    def __str__(self) -> str:
        return str(self.id)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


class RunToken(models.Model):
    """The run API token handed out in RunContext, stored only as its sha256."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="token")
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(db_default=Now())
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "run_token"

    def __str__(self) -> str:
        return f"token of run {self.run_id}"


class RunEvent(models.Model):
    # No index of its own: run_event_run_at_idx (run, at) serves it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    at = models.DateTimeField()
    kind = models.CharField(max_length=64)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "run_event"
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["run", "at"], name="run_event_run_at_idx")]

    def __str__(self) -> str:
        return f"{self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"


class RunLogOutbox(models.Model):
    """A run whose log objects still need work after the transaction that queued it (an outbox row).

    A plain id, not a foreign key: retention deletes runs set-based, and a
    row may outlive its run (a purge always does; a flush whose run is gone
    has nothing left to flush and is dropped). Oldest first.
    """

    run_id = models.UUIDField(primary_key=True)
    queued_at = models.DateTimeField()
    # What the row is for, in __str__.
    what = ""

    class Meta:
        abstract = True
        ordering = ["queued_at"]

    def __str__(self) -> str:
        return f"{self.what} of run {self.run_id}"


class LogFlush(RunLogOutbox):
    """A run failed without its runner whose live log must still reach storage as its final chunk.

    ``services.runner_force_delete`` writes one in the transaction that fails
    the run and deletes its runner; the flush runs after commit and deletes
    this row. The runner row is gone by then, so nothing else would retry a
    flush that failed (storage down): the inactive-runner reaper does, from
    here, until it lands or the live record has expired (nothing left to
    flush). Other paths that fail a run without its runner keep the runner
    row until the flush lands instead.
    """

    what = "log flush"

    class Meta(RunLogOutbox.Meta):
        db_table = "log_flush"


class LogPurge(RunLogOutbox):
    """A run retention deleted whose stored log chunks and Redis records are still to be removed.

    The retention reaper (``gantry.reapers.retention``) writes one in the same
    transaction that deletes the run, then deletes the objects and this row
    after commit. A failed delete leaves the row, retried on the next tick, so
    no run row ever names a missing chunk and no chunk is orphaned for ever.
    """

    what = "log purge"

    class Meta(RunLogOutbox.Meta):
        db_table = "log_purge"


# ---------------------------------------------------------------- webhooks (docs/webhooks.md)

# The events an endpoint may subscribe to, in a run's order. The run events are
# written by gantry.sql.runs' effects (the edge or the status a run reaches
# names them: WEBHOOK_EVENT_OF_EDGE, WEBHOOK_EVENT_OF_STATUS); deployment.finished
# when a run's effects bring its deployment to a terminal status.
WEBHOOK_RUN_QUEUED = "run.queued"
WEBHOOK_RUN_RUNNING = "run.running"
WEBHOOK_DEPLOYMENT_FINISHED = "deployment.finished"
WEBHOOK_EVENT_OF_STATUS: dict[str, str] = {
    RunStatus.SUCCEEDED: "run.succeeded",
    RunStatus.FAILURE: "run.failure",
    RunStatus.CANCELLED: "run.cancelled",
    RunStatus.STARTUP_TIMEOUT: "run.startup_timeout",
}
WEBHOOK_EVENTS: tuple[str, ...] = (
    WEBHOOK_RUN_QUEUED,
    WEBHOOK_RUN_RUNNING,
    *WEBHOOK_EVENT_OF_STATUS.values(),
    WEBHOOK_DEPLOYMENT_FINISHED,
)
DEPLOYMENT_FINISHED = frozenset(
    {DeploymentStatus.SUCCEEDED, DeploymentStatus.FAILED, DeploymentStatus.CANCELLED, DeploymentStatus.SKIPPED}
)


class WebhookEndpoint(models.Model):
    """An org's receiver of run events: a URL, the events it wants, and the secret its deliveries are signed with.

    The secret is sealed at rest like stack secrets (gantry.core.secrets: a
    Fernet token in ``secret_sealed``); it is unsealed only to sign a delivery
    and never answered.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    # A JSON list of event names: the run effects match it with jsonb's `events ? '<event>'`.
    events = models.JSONField(default=list)
    secret_sealed = models.TextField()
    created_at = models.DateTimeField(db_default=Now())
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        db_table = "webhook_endpoint"
        # The run effects look an org's endpoints up on every event edge: by the organization FK's index.
        ordering = ["organization_id", "id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of {self.organization_id}: {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


# A delivery no sender will touch again: retention may remove it (gantry.sql.retention).
DELIVERY_FINISHED = frozenset({DeliveryStatus.DELIVERED, DeliveryStatus.FAILED})


class WebhookDelivery(models.Model):
    """One event for one endpoint: the outbox row, written by the transition's own statement (gantry.sql.runs).

    ``body`` is the exact JSON text sent, every attempt alike (the signature
    covers those bytes). The bigserial ``id`` orders a run's deliveries: it is
    drawn after the run's row lock, so a later transition of a run always has a
    larger one; a run's delivery to an endpoint waits while an earlier one is
    pending (gantry.webhooks.delivery). ``run_id`` is a plain id (no FK to
    check on every transition's insert): retention deletes a run's finished
    deliveries in the statement that deletes the run, and a pending one finishes
    its tries (its body carries all it says) and goes with the finished rows
    past retention (gantry.sql.retention).
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: webhook_delivery_recent_idx (endpoint, -id) serves it.
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries", db_index=False)
    run_id = models.UUIDField()
    event = models.CharField(max_length=32)
    body = models.TextField()
    delivery_id = models.UUIDField(unique=True)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    next_attempt_at = models.DateTimeField()
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="", db_default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    # When the last attempt ended; for a failed delivery, when the sender gave up. Null until the first.
    last_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "webhook_delivery"
        ordering = ["id"]
        indexes = [
            # The due scan: pending rows by when they are due (only pending ones are in it).
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(status=DeliveryStatus.PENDING),
                name="webhook_delivery_due_idx",
            ),
            # Order per run: "an earlier pending delivery of this run to this endpoint".
            models.Index(
                fields=["endpoint", "run_id", "id"],
                condition=Q(status=DeliveryStatus.PENDING),
                name="webhook_delivery_order_idx",
            ),
            # An endpoint's recent deliveries (the page, the API); also serves the FK.
            models.Index(fields=["endpoint", "-id"], name="webhook_delivery_recent_idx"),
            # Retention (migration 0023): finished rows by when they were last tried, and by run (deleted
            # with their run). Only finished rows are in them, so the sender's writes to pending ones add nothing.
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(status__in=sorted(DELIVERY_FINISHED)),
                name="webhook_delivery_finished_idx",
            ),
            models.Index(
                fields=["run_id"],
                condition=Q(status__in=sorted(DELIVERY_FINISHED)),
                name="webhook_delivery_run_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.delivery_id} ({self.status})"
