"""Answer and request shapes of the user and admin API (docs/design.md §4).

Output serializers are read-only renderings; request serializers check types
only. Domain rules (label namespaces, spec shape, state) live in the services,
which raise the contract's errors.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gantry.core.models import (
    PRIORITY_NAMES,
    Deployment,
    GroupKind,
    Organization,
    Priority,
    Role,
    Run,
    RunEvent,
    RunnerGroup,
    Stack,
)
from gantry.core.services.runs import run_timings

# ---------------------------------------------------------------- JSON-stored request fields
#
# Labels, specs and secrets arrive as JSON and are checked by the services
# (gantry.core.specs): DRF's CharField would coerce 1 to "1", and the spec's
# rules (unknown keys refused, step and size limits) live in one place. These
# fields keep that, and tell the OpenAPI document the real shape.

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


@extend_schema_field(_STRING_MAP)
class LabelsField(serializers.JSONField):
    """An object of string keys and string values."""


@extend_schema_field({**_STRING_MAP, "writeOnly": True})
class SecretsField(serializers.JSONField):
    """Secret name → value; write-only (answers carry the names only)."""


class PriorityField(serializers.ChoiceField):
    """A priority by name (``low``, ``normal``, ``high``); stored as its level (``Priority``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=list(PRIORITY_NAMES), **kwargs)

    def to_internal_value(self, data: Any) -> Priority:  # type: ignore[override]  # the level, not the name
        level = Priority.named(super().to_internal_value(data))
        assert level is not None  # a valid choice is a priority's label
        return level

    def to_representation(self, value: Any) -> str:
        return Priority(value).label


class OrganizationSerializer(serializers.ModelSerializer):
    default_runner_group_id = serializers.IntegerField(allow_null=True, read_only=True)

    class Meta:
        model = Organization
        fields = [
            "id",
            "slug",
            "name",
            "runs_per_hour_limit",
            "dispatch_throttled_until",
            "default_runner_group_id",
            "max_in_flight",
            "created_at",
        ]
        read_only_fields = fields


class OrganizationCreateSerializer(serializers.Serializer):
    slug = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=200)


class OrganizationUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    default_runner_group_id = serializers.IntegerField(allow_null=True, required=False)


class RunsPerHourLimitSerializer(serializers.Serializer):
    runs_per_hour_limit = serializers.IntegerField(min_value=0, max_value=1_000_000)


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MemberCreatedSerializer(MemberSerializer):
    token = serializers.CharField(
        required=False, help_text="The new user's API token; present only when this call created the user."
    )
    set_password_url = serializers.URLField(
        required=False,
        help_text="A one-time link for the new user to set a password and log in; shown once, valid until "
        "set_password_expires_at (GANTRY_PASSWORD_LINK_TTL). Present only when this call created the user.",
    )
    set_password_expires_at = serializers.DateTimeField(required=False)


class MemberInvitedSerializer(MemberSerializer):
    invitation_id = serializers.IntegerField(help_text="The invitation the user accepts (or declines).")
    status = serializers.ChoiceField(choices=["invited"], help_text="Pending until the invited user accepts.")


class PasswordLinkSerializer(serializers.Serializer):
    set_password_url = serializers.URLField(help_text="One-time link; every earlier one stops working.")
    set_password_expires_at = serializers.DateTimeField()


class InvitationSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    org = serializers.CharField(source="organization.slug")
    org_name = serializers.CharField(source="organization.name")
    role = serializers.ChoiceField(choices=Role.choices)
    invited_by = serializers.CharField(source="invited_by.username", allow_null=True, default=None)
    created_at = serializers.DateTimeField()


class RunnerGroupSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunnerGroup
        fields = [
            "id",
            "organization_id",
            "name",
            "kind",
            "labels",
            "max_concurrent_runs",
            "drained",
            "last_dispatch_error",
            "last_dispatch_error_at",
            "last_polled_at",
            "github_owner",
            "github_repo",
            "github_workflow",
            "github_ref",
            "created_at",
            "archived_at",
        ]
        read_only_fields = fields


class RunnerGroupWithTokenSerializer(RunnerGroupSerializer):
    token = serializers.CharField(help_text="The group's token; shown once, never again.")

    class Meta(RunnerGroupSerializer.Meta):
        fields = [*RunnerGroupSerializer.Meta.fields, "token"]
        read_only_fields = fields


class RunnerGroupCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=GroupKind.choices, default=GroupKind.SELF_HOSTED)
    # Checked by the service (strings only, reserved prefixes): DRF's CharField would coerce 1 to "1".
    labels = LabelsField(required=False, help_text="Capability labels: an object of string keys and values.")
    max_concurrent_runs = serializers.IntegerField(min_value=1, max_value=100_000, default=10)
    github_owner = serializers.CharField(max_length=100, required=False, allow_blank=True)
    github_repo = serializers.CharField(max_length=100, required=False, allow_blank=True)
    github_workflow = serializers.CharField(max_length=200, required=False, allow_blank=True)
    github_ref = serializers.CharField(max_length=200, required=False, allow_blank=True)


class RunnerGroupUpdateSerializer(RunnerGroupCreateSerializer):
    name = serializers.CharField(max_length=100, required=False)
    kind = None  # type: ignore[assignment]  # a group's kind is fixed at creation
    max_concurrent_runs = serializers.IntegerField(min_value=1, max_value=100_000, required=False)


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="The new group token; shown once.")


# ---------------------------------------------------------------- fast paths
#
# Building a DRF serializer deep-copies every declared field, and validating or
# rendering walks them all: on the runner's hot calls that cost more Python
# than the calls' statements. So a serializer on those calls carries a
# ``fast_validate`` (or ``fast_represent``) beside it: the same result for the
# plain shapes a well-behaved runner sends and receives, and None for anything
# else, which then goes to the serializer itself (every refusal, its code and
# its ``fields`` detail stay DRF's). tests/api/test_fast_serializers.py holds
# each pair equal on generated plain and hostile values.


def plain_str(value: Any, max_length: int, *, allow_blank: bool = True) -> bool:
    """Whether a DRF CharField (trimming, the default) takes ``value`` unchanged: a str, no surrounding
    whitespace to trim, no NUL or surrogate (isprintable), within ``max_length``."""
    return (
        type(value) is str
        and len(value) <= max_length
        and (allow_blank or value != "")
        and value == value.strip()
        and value.isprintable()
    )


def int_in(value: Any, low: int, high: int) -> bool:
    """Whether a DRF IntegerField with these bounds takes ``value`` unchanged (an int; a bool is not one to DRF)."""
    return type(value) is int and low <= value <= high


def str_dict(value: Any) -> bool:
    """A dict of str keys and str values: what a DictField(child=CharField()) renders unchanged."""
    return type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items())


class StepSerializer(serializers.Serializer):
    name = serializers.CharField()
    run = serializers.CharField(help_text="A shell command line.")


class SpecSerializer(serializers.Serializer):
    steps = StepSerializer(many=True)
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    timeout_seconds = serializers.IntegerField(required=False, min_value=1)

    @staticmethod
    def fast_represent(spec: Any) -> dict[str, Any] | None:
        """``SpecSerializer(spec).data`` for a plain spec (steps of name and run, optional env and
        timeout_seconds, nothing else), or None: let the serializer render it."""
        if type(spec) is not dict or "steps" not in spec or not spec.keys() <= _SPEC_KEYS:
            return None
        steps = spec["steps"]
        if type(steps) is not list or not all(
            type(s) is dict and s.keys() == _STEP_KEYS and type(s["name"]) is str and type(s["run"]) is str
            for s in steps
        ):
            return None
        out: dict[str, Any] = {"steps": [{"name": s["name"], "run": s["run"]} for s in steps]}
        if "env" in spec:
            env = spec["env"]
            if env is not None and not str_dict(env):
                return None
            out["env"] = dict(env) if env is not None else None
        if "timeout_seconds" in spec:
            timeout = spec["timeout_seconds"]
            if timeout is not None and type(timeout) is not int:
                return None
            out["timeout_seconds"] = timeout
        return out


_SPEC_KEYS = frozenset({"steps", "env", "timeout_seconds"})
_STEP_KEYS = frozenset({"name", "run"})


@extend_schema_field(SpecSerializer)
class SpecField(serializers.JSONField):
    """A run spec (``SpecSerializer``'s shape), checked by ``gantry.core.specs``."""


class StackSerializer(serializers.ModelSerializer):
    spec = SpecSerializer(read_only=True, allow_null=True)
    default_priority = PriorityField(read_only=True, help_text="The priority of a deployment that names none.")
    runner_selector = serializers.DictField(child=serializers.CharField(), read_only=True)
    secret_names = serializers.SerializerMethodField()

    class Meta:
        model = Stack
        fields = [
            "id",
            "organization_id",
            "name",
            "labels",
            "runner_selector",
            "spec",
            "secret_names",
            "default_priority",
            "created_at",
            "archived_at",
        ]
        read_only_fields = fields

    def get_secret_names(self, stack: Stack) -> list[str]:
        # Secret values are write-only: they reach runners only inside RunContext.
        return sorted(stack.secrets)


class StackCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    labels = LabelsField(required=False, help_text="Label map; keys under gantry:runner-group: select runner groups.")
    spec = SpecField(required=False, help_text="The default run spec for this stack's deployments.")
    secrets = SecretsField(required=False, help_text="Name → value; write-only.")
    default_priority = PriorityField(
        required=False, help_text="The priority of a deployment that names none (default normal); high: admins only."
    )


class StackUpdateSerializer(StackCreateSerializer):
    name = serializers.CharField(max_length=100, required=False)


class RunRefSerializer(serializers.ModelSerializer):
    priority = PriorityField(read_only=True)

    class Meta:
        model = Run
        fields = ["id", "status", "priority"]
        read_only_fields = fields


class RunAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Run
        fields = ["id", "attempt", "status", "created_at", "started_at", "finished_at"]
        read_only_fields = fields


class DeploymentSerializer(serializers.ModelSerializer):
    run = serializers.SerializerMethodField()
    runs = serializers.SerializerMethodField()
    stack_id = serializers.IntegerField(read_only=True)

    class Meta:
        model = Deployment
        fields = ["id", "status", "stack_id", "spec", "run", "runs", "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(RunRefSerializer(allow_null=True))
    def get_run(self, deployment: Deployment) -> dict[str, Any] | None:
        # The newest attempt; from the prefetch cache when the view prefetched runs.
        run = max(deployment.runs.all(), key=lambda r: r.attempt, default=None)
        return RunRefSerializer(run).data if run else None

    @extend_schema_field(RunAttemptSerializer(many=True))
    def get_runs(self, deployment: Deployment) -> list[dict[str, Any]]:
        # Every attempt, oldest first: a retried deployment's earlier runs stay reachable.
        return list(RunAttemptSerializer(sorted(deployment.runs.all(), key=lambda r: r.attempt), many=True).data)


class DeploymentCreateSerializer(serializers.Serializer):
    spec = SpecField(required=False, help_text="Defaults to the stack's spec.")
    priority = PriorityField(
        required=False,
        help_text="Its run's place in the claim's order; defaults to the stack's default_priority. "
        "high needs the org admin role (403 priority_forbidden).",
    )


class RunUpdateSerializer(serializers.Serializer):
    priority = PriorityField(help_text="The waiting run's new priority (org admin; 409 run_not_waiting once claimed).")


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["kind", "at", "detail"]
        read_only_fields = fields


class RunTimingsSerializer(serializers.Serializer):
    """A run's phases in seconds, each null until known (gantry.core.services.runs.run_timings)."""

    wait_seconds = serializers.FloatField(
        allow_null=True, help_text="First pending (its turn on the stack's lane) to first claimed by a runner group."
    )
    start_seconds = serializers.FloatField(
        allow_null=True,
        help_text="First claimed to accepted: its runner's start-up (and a lease that lapsed on the way).",
    )
    first_output_seconds = serializers.FloatField(
        allow_null=True, help_text="Accept to the run's first output reaching Gantry."
    )
    run_seconds = serializers.FloatField(allow_null=True, help_text="Accept to finished.")


class RunSerializer(serializers.ModelSerializer):
    priority = PriorityField(read_only=True)
    deployment_id = serializers.IntegerField(read_only=True)
    stack_id = serializers.IntegerField(read_only=True)
    assigned_runner_id = serializers.UUIDField(read_only=True, allow_null=True)
    events = RunEventSerializer(many=True, read_only=True)
    timings = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "status",
            "priority",
            "deployment_id",
            "stack_id",
            "attempt",
            "runner_selector",
            "assigned_runner_id",
            "assigned_expires_at",
            "first_pending_at",
            "first_claimed_at",
            "started_at",
            "first_output_at",
            "finished_at",
            "exit_code",
            "failure_reason",
            "cancel_requested_at",
            "created_at",
            "timings",
            "events",
        ]
        read_only_fields = fields

    @extend_schema_field(RunTimingsSerializer)
    def get_timings(self, run: Run) -> dict[str, float | None]:
        return run_timings(run)
