"""The Django admin for Gantry, scoped by organization.

Who sees what:
- a superuser sees and edits everything;
- an *org admin* (a staff user holding the ``admin`` role in one or more
  orgs) sees and edits only the objects of those orgs, without needing any
  Django model permission: the Membership is the grant;
- any other staff user (a ``member`` only, or no admin role anywhere) sees no
  Gantry model at all.

Scoping lives in ``get_queryset``, so another org's object is simply absent:
its change page answers Django's usual "doesn't exist" redirect and an action
posted with its id selects nothing. Foreign-key choices are narrowed the same
way, so a form cannot point at another org's rows either.

Writes go through ``gantry.core.services`` (CONVENTIONS 1): the admin never
sets a run's or deployment's status; runs, deployments and runners are
read-only here, and their actions call the same service functions as the API.
Nothing is deletable except memberships: there is no service for deleting an
org, group or stack, and the ORM cascade would pull live runs out from under
their runners. A runner goes only through its force-delete action (the
service fails the run it was executing first).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from gantry.core import services, specs
from gantry.core.errors import GantryError, InvalidRequest
from gantry.core.models import (
    Deployment,
    Membership,
    Organization,
    Priority,
    Run,
    RunEvent,
    Runner,
    RunnerGroup,
    Stack,
)
from gantry.reapers.reapers import force_delete_runner
from gantry.web.admin_display import (
    ArchivedFilter,
    ArchivedReadOnly,
    NoCreatedAtOnAdd,
    RunColumns,
    StorableJSONField,
    seconds,
)
from gantry.web.admin_scoping import (
    ReadOnlyInline,
    ReadOnlyScopedAdmin,
    ScopedAdmin,
    acting_user,
    admin_org_ids,
    adopt,
    allowed,
    check_unique_name,
    form_validated,
    scope_fk_choices,
)

# --------------------------------------------------------------------------
# Organizations and memberships
# --------------------------------------------------------------------------


class MembershipForm(forms.ModelForm):
    class Meta:
        model = Membership
        fields = ["user", "role"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A membership is a (user, org) pair: change its role or delete it,
        # never re-point it at someone else.
        if self.instance.pk is not None:
            self.fields["user"].disabled = True


class MembershipInline(admin.TabularInline):
    model = Membership
    form = MembershipForm
    extra = 0
    fields = ["user", "role", "joined"]
    readonly_fields = ["joined"]

    @admin.display(description="joined")
    def joined(self, membership: Membership) -> str:
        # An unsaved row's created_at is the database default's marker, not a time.
        return seconds(membership.created_at) if membership.pk else "-"

    def _allowed(self, request: HttpRequest, obj: Any) -> bool:
        return allowed(request, obj, "pk")  # obj is the parent Organization

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, obj)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        scope_fk_choices(request, db_field, kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class OrganizationForm(forms.ModelForm):
    class Meta:
        model = Organization
        fields = ["slug", "name", "runs_per_hour_limit", "max_in_flight", "default_runner_group"]

    def clean_default_runner_group(self) -> RunnerGroup | None:
        group = self.cleaned_data.get("default_runner_group")
        if group is not None and group.organization_id != self.instance.pk:
            raise ValidationError("The default runner group must belong to this organization.")
        return group


# Dispatch budget and identity: a super-admin's to set (docs/design.md §4: the rate is
# read-only for org admins); the throttle stamp belongs to the dispatcher.
ROOT_ONLY_ORG_FIELDS = ("slug", "runs_per_hour_limit", "max_in_flight")
SYSTEM_ORG_FIELDS = ("dispatch_throttled_until", "created_at")


@admin.register(Organization)
class OrganizationAdmin(NoCreatedAtOnAdd, ScopedAdmin):
    org_path = "pk"
    form = OrganizationForm
    inlines = [MembershipInline]
    fields = [
        "slug",
        "name",
        "runs_per_hour_limit",
        "max_in_flight",
        "default_runner_group",
        "dispatch_throttled_until",
        "created_at",
    ]
    list_display = ["slug", "name", "runs_per_hour_limit", "dispatch_throttled_until", "max_in_flight", "created_at"]
    search_fields = ["slug", "name"]
    ordering = ["slug"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if admin_org_ids(request) is None:
            return SYSTEM_ORG_FIELDS
        return ROOT_ONLY_ORG_FIELDS + SYSTEM_ORG_FIELDS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return admin_org_ids(request) is None  # org admins cannot create orgs

    def save_model(self, request: HttpRequest, obj: Organization, form: Any, change: bool) -> None:
        data, changed = form.cleaned_data, set(form.changed_data)
        if not change:
            adopt(obj, services.org_create(slug=data["slug"], name=data["name"]))
            changed -= {"slug", "name"}
        plain = [f for f in ("slug", "name", "max_in_flight") if f in changed]
        if plain:
            for f in plain:
                setattr(obj, f, data[f])
            obj.save(update_fields=plain)
        if "default_runner_group" in changed:
            group = data["default_runner_group"]
            services.org_update(org=obj, default_runner_group_id=group.id if group else None)
        if "runs_per_hour_limit" in changed:
            # Through the service: a new rate must also clear the throttle stamp.
            services.org_set_runs_per_hour_limit(org=obj, limit=data["runs_per_hour_limit"])

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        if formset.model is not Membership:
            super().save_formset(request, form, formset, change)
            return
        # commit=False still fills new/changed/deleted_objects for the admin's log.
        formset.save(commit=False)
        by = acting_user(request)
        # Grants first, removals after: promoting B and removing A in one save keeps the org an admin.
        for membership in [*formset.new_objects, *(m for m, _ in formset.changed_objects)]:
            # membership_set also makes a new org admin staff, so the grant works here; someone not yet
            # a member is invited (they join once they accept), never attached without consent.
            try:
                result = services.membership_set(
                    org=form.instance, username=membership.user.username, role=membership.role, by=by
                )
            except GantryError as exc:  # last_admin: the page says so, the rest of the form saves
                self.message_user(request, exc.detail, messages.ERROR)
                continue
            if result.invitation is not None:
                self.message_user(
                    request, f"Invited {membership.user.username}: they join once they accept.", messages.INFO
                )
        for membership in formset.deleted_objects:
            try:
                # The service, not a bare delete: it holds the last-admin rule (and drops a pending invitation).
                assert by is not None  # the admin is logged in
                services.membership_remove(org=form.instance, username=membership.user.username, by=by)
            except GantryError as exc:
                self.message_user(request, exc.detail, messages.ERROR)


# --------------------------------------------------------------------------
# Runner groups and runners
# --------------------------------------------------------------------------

GROUP_FIELDS = (
    "name",
    "kind",
    "labels",
    "max_concurrent_runs",
    "github_owner",
    "github_repo",
    "github_workflow",
    "github_ref",
)


class RunnerGroupForm(forms.ModelForm):
    class Meta:
        model = RunnerGroup
        fields = ["organization", *GROUP_FIELDS]

    def clean_labels(self) -> dict[str, str]:
        return form_validated(specs.validate_group_labels, self.cleaned_data.get("labels") or {})

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        check_unique_name(self, RunnerGroup)
        data = self.cleaned_data
        kind = data.get("kind") or self.instance.kind
        try:
            data.update(specs.validate_github_fields(kind, {f: data.get(f, "") for f in specs.GITHUB_FIELDS}))
        except InvalidRequest as exc:
            field = next(iter(exc.extra.get("fields", {})), None)
            self.add_error(field if field in self.fields else None, exc.detail)
        return cleaned


@admin.register(RunnerGroup)
class RunnerGroupAdmin(ArchivedReadOnly, NoCreatedAtOnAdd, ScopedAdmin):
    form = RunnerGroupForm
    fields = [
        "organization",
        *GROUP_FIELDS,
        "drained",
        "runner_count",
        "token_version",
        "last_polled_at",
        "last_dispatch_error",
        "last_dispatch_error_at",
        "created_at",
    ]
    list_display = [
        "name",
        "organization",
        "kind",
        "drained",
        "runner_count",
        "max_concurrent_runs",
        "token_version",
        "last_polled_at",
        "last_dispatch_error_at",
        "archived_at",
    ]
    list_filter = [ArchivedFilter, "kind", "drained", ("organization", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["organization"]
    search_fields = ["name", "organization__slug"]
    ordering = ["organization__slug", "name"]
    actions = ["rotate_token", "drain", "undrain"]
    # Drained and the token change only through the actions (services); the
    # rest is written by the dispatcher and the poll.
    readonly_fields = [
        "drained",
        "runner_count",
        "token_version",
        "last_polled_at",
        "last_dispatch_error",
        "last_dispatch_error_at",
        "created_at",
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # A group's token and runners belong to its org; it never moves.
        return [*self.readonly_fields, "organization"] if obj is not None else list(self.readonly_fields)

    def _live(self, request: HttpRequest, queryset: QuerySet[RunnerGroup]) -> QuerySet[RunnerGroup]:
        """The actions' groups without the archived ones, each of those named in a warning."""
        for name in queryset.filter(archived_at__isnull=False).values_list("name", flat=True):
            self.message_user(request, f"{name}: the runner group is archived; left as it is", messages.WARNING)
        return queryset.filter(archived_at__isnull=True)

    def save_model(self, request: HttpRequest, obj: RunnerGroup, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            services.runner_group_update(group=obj, **{f: data[f] for f in form.changed_data if f in GROUP_FIELDS})
            return
        group, token = services.runner_group_create(
            org=data["organization"], **{f: data[f] for f in GROUP_FIELDS if f in data}
        )
        adopt(obj, group)
        self._show_token(request, group, token)

    def _show_token(self, request: HttpRequest, group: RunnerGroup, token: str) -> None:
        # The one and only time the token is shown: Gantry keeps no copy.
        self.message_user(
            request,
            f"Token for runner group {group.organization.slug}/{group.name} (shown once, copy it now): {token}",
            messages.SUCCESS,
        )

    @admin.action(description="Rotate token (the old one stops working at once)", permissions=["change"])
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[RunnerGroup]) -> None:
        for group in self._live(request, queryset).select_related("organization"):
            self._show_token(request, group, services.runner_group_rotate_token(group=group))

    @admin.action(description="Drain selected groups (stop dispatch)", permissions=["change"])
    def drain(self, request: HttpRequest, queryset: QuerySet[RunnerGroup]) -> None:
        self._apply(
            request,
            self._live(request, queryset),
            lambda g: services.runner_group_set_drained(group=g, drained=True),
            "Drained {count} runner group(s).",
        )

    @admin.action(description="Undrain selected groups (resume dispatch)", permissions=["change"])
    def undrain(self, request: HttpRequest, queryset: QuerySet[RunnerGroup]) -> None:
        self._apply(
            request,
            self._live(request, queryset),
            lambda g: services.runner_group_set_drained(group=g, drained=False),
            "Undrained {count} runner group(s).",
        )


@admin.register(Runner)
class RunnerAdmin(ReadOnlyScopedAdmin):
    # Runners come and go with the protocol (poll, deregister, reapers).
    org_path = "runner_group__organization"
    list_display = ["id", "runner_group", "status", "launcher", "hostname", "created_at", "last_seen_at"]
    list_filter = ["status", ("runner_group", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["runner_group__organization"]
    search_fields = ["=id", "hostname", "runner_group__name", "runner_group__organization__slug"]
    ordering = ["-created_at"]
    actions = ["force_delete"]

    @admin.action(
        description="Force-delete selected runners (offline past the force gate; fails the run each was executing)",
        permissions=["operate"],
    )
    def force_delete(self, request: HttpRequest, queryset: QuerySet[Runner]) -> None:
        by = acting_user(request)
        self._apply(
            request,
            queryset,
            lambda r: force_delete_runner(runner_id=r.id, by=by, now=timezone.now()),
            "Force-deleted {count} runner(s).",
            label=lambda r: f"Runner {r.id}",
        )


# --------------------------------------------------------------------------
# Stacks
# --------------------------------------------------------------------------

STACK_FIELDS = ("name", "labels", "spec", "default_priority")


class StackForm(forms.ModelForm):
    # Secret values are write-only, as in the API: the form never shows them;
    # it takes changes only (name → value sets one, name → null removes it).
    secrets_update = StorableJSONField(
        required=False,
        label="Set secrets",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='JSON object: {"NAME": "value"} sets a secret, {"NAME": null} removes it. '
        "Values are never shown again.",
    )

    # A select of the three names; a post without it (an older form, a script) means normal, the model's default.
    default_priority = forms.TypedChoiceField(
        choices=Priority.choices,
        coerce=int,
        required=False,
        empty_value=Priority.NORMAL,  # type: ignore[arg-type]  # returned as is, an int like coerce
        initial=Priority.NORMAL,
        help_text="The priority of a deployment that names none (docs/queue.md).",
    )

    class Meta:
        model = Stack
        fields = ["organization", *STACK_FIELDS]

    def clean_labels(self) -> dict[str, str]:
        return form_validated(specs.validate_stack_labels, self.cleaned_data.get("labels") or {})

    def clean_spec(self) -> dict[str, Any] | None:
        # Empty means "no default spec" (deployments bring their own), never an empty spec.
        spec = self.cleaned_data.get("spec")
        return form_validated(specs.validate_spec, spec) if spec else None

    def clean_secrets_update(self) -> dict[str, str | None]:
        update = self.cleaned_data.get("secrets_update")
        if update is None:
            return {}
        if not isinstance(update, dict) or not all(
            isinstance(k, str) and k and (v is None or isinstance(v, str)) for k, v in update.items()
        ):
            raise ValidationError("Give a JSON object mapping secret names to a string, or to null to remove it.")
        # The same rules as the API: names a step's shell can use, storable values.
        form_validated(specs.validate_secrets, {k: v for k, v in update.items() if v is not None})
        return update

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        check_unique_name(self, Stack)
        return cleaned


@admin.register(Stack)
class StackAdmin(ArchivedReadOnly, NoCreatedAtOnAdd, ScopedAdmin):
    form = StackForm
    fields = ["organization", *STACK_FIELDS, "secret_names", "secrets_update", "created_at"]
    # No secrets here: list views show names only (see secret_names).
    list_display = ["name", "organization", "selector", "default_priority", "secret_names", "created_at", "archived_at"]
    list_filter = [ArchivedFilter, ("organization", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["organization"]
    search_fields = ["name", "organization__slug"]
    ordering = ["organization__slug", "name"]
    readonly_fields = ["secret_names", "created_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*self.readonly_fields, "organization"] if obj is not None else list(self.readonly_fields)

    @admin.display(description="runner selector")
    def selector(self, stack: Stack) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(stack.runner_selector.items())) or "(any)"

    @admin.display(description="secrets")
    def secret_names(self, stack: Stack) -> str:
        return ", ".join(sorted(stack.secrets)) or "-"

    def save_model(self, request: HttpRequest, obj: Stack, form: Any, change: bool) -> None:
        data = form.cleaned_data
        update = data.get("secrets_update") or {}
        if change:
            fields = {f: data[f] for f in form.changed_data if f in STACK_FIELDS}
            services.stack_update(stack=obj, **fields)
            if update:
                services.stack_set_secrets(stack=obj, changes=update)
            return
        stack = services.stack_create(
            org=data["organization"],
            name=data["name"],
            labels=data["labels"],
            spec=data["spec"],
            secrets={k: v for k, v in update.items() if v is not None},
            default_priority=data["default_priority"],
        )
        adopt(obj, stack)


# --------------------------------------------------------------------------
# Deployments and runs: read-only; actions call the state machine's services
# --------------------------------------------------------------------------


class RunInline(ReadOnlyInline):
    model = Run
    parent_org_path = "stack__organization"  # the parent is a Deployment
    fields = ["id", "attempt", "status", "created_at", "started_at", "finished_at", "failure_reason"]
    ordering = ["attempt"]
    show_change_link = True


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyScopedAdmin):
    org_path = "stack__organization"
    inlines = [RunInline]
    list_display = ["id", "stack", "org", "status", "created_by", "created_at", "updated_at"]
    list_filter = ["status", ("stack__organization", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["stack__organization", "created_by"]
    search_fields = ["=id", "stack__name", "stack__organization__slug"]
    date_hierarchy = "created_at"
    actions = ["skip", "retry"]

    @admin.display(description="organization", ordering="stack__organization__slug")
    def org(self, deployment: Deployment) -> str:
        return deployment.stack.organization.slug

    @admin.action(description="Skip selected deployments (discard runs not yet started)", permissions=["operate"])
    def skip(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        by = acting_user(request)
        self._apply(
            request,
            queryset,
            lambda d: services.deployment_skip(deployment_id=d.id, by=by),
            "Skipped {count} deployment(s).",
        )

    @admin.action(description="Retry selected deployments (new attempt)", permissions=["operate"])
    def retry(self, request: HttpRequest, queryset: QuerySet[Deployment]) -> None:
        by = acting_user(request)
        self._apply(
            request,
            queryset,
            lambda d: services.deployment_retry(deployment_id=d.id, by=by),
            "Retried {count} deployment(s).",
        )


class RunEventInline(ReadOnlyInline):
    model = RunEvent
    parent_org_path = "organization"  # the parent is a Run
    fields = ["when", "kind", "detail"]
    readonly_fields = ["when"]
    ordering = ["at", "id"]

    @admin.display(description="at")
    def when(self, event: RunEvent) -> str:
        return seconds(event.at)


@admin.register(Run)
class RunAdmin(RunColumns, ReadOnlyScopedAdmin):
    inlines = [RunEventInline]
    list_display = [
        "id",
        "status",
        "priority",
        "organization",
        "stack",
        "deployment",
        "attempt",
        "runner_group",
        "reason",
        "first_pending_at",
        "started_at",
        "finished_at",
    ]
    list_filter = [
        "status",
        "priority",
        ("organization", admin.RelatedOnlyFieldListFilter),
        ("stack", admin.RelatedOnlyFieldListFilter),
    ]
    list_select_related = ["organization", "stack", "deployment"]
    search_fields = ["=id", "stack__name", "organization__slug"]
    date_hierarchy = "created_at"
    ordering = ["-created_at"]
    actions = ["cancel"]

    @admin.action(description="Cancel selected runs", permissions=["operate"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        by = acting_user(request)
        self._apply(
            request,
            queryset,
            lambda r: services.run_request_cancellation(run_id=r.id, by=by),
            "Asked to cancel {count} run(s).",
            label=lambda r: f"Run {r.id}",
        )
