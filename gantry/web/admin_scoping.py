"""What every Gantry admin page shares: scoping by organization, read-only bases, and small helpers.

``gantry.web.admin`` builds each model's page on these. Scoping lives in
``get_queryset`` (another org's object is simply absent) and in the foreign-key
choices (a form cannot point at another org's rows); an org admin needs no
Django model permission, the Membership is the grant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from gantry.core import services
from gantry.core.errors import GantryError, InvalidRequest, NameTaken
from gantry.core.models import Membership, Organization, Role, RunnerGroup, Stack
from gantry.web.admin_display import StorableJSONField

# --------------------------------------------------------------------------
# Scoping
# --------------------------------------------------------------------------

_CACHE_ATTR = "_gantry_admin_org_ids"


def admin_org_ids(request: HttpRequest) -> frozenset[int] | None:
    """The ids of the orgs whose objects this user may administer; ``None`` means every org.

    Asked many times per page (every permission check, every inline), so the
    answer is kept on the request.
    """
    if hasattr(request, _CACHE_ATTR):
        cached: frozenset[int] | None = getattr(request, _CACHE_ATTR)
        return cached
    user = request.user
    orgs: frozenset[int] | None
    if not isinstance(user, User) or not user.is_active or not user.is_staff:
        orgs = frozenset()
    elif user.is_superuser:
        orgs = None
    else:
        orgs = frozenset(
            Membership.objects.filter(user=user, role=Role.ADMIN).values_list("organization_id", flat=True)
        )
    setattr(request, _CACHE_ATTR, orgs)
    return orgs


def org_id_of(obj: Model, path: str) -> int:
    """Follow ``path`` (``"pk"`` or e.g. ``"stack__organization"``) from ``obj`` to its org id."""
    if path == "pk":
        return int(obj.pk)
    *hops, last = path.split("__")
    for hop in hops:
        obj = getattr(obj, hop)
    return int(getattr(obj, f"{last}_id"))


def allowed(request: HttpRequest, obj: Model | None, path: str) -> bool:
    orgs = admin_org_ids(request)
    if orgs is None:
        return True
    if not orgs:
        return False
    return obj is None or org_id_of(obj, path) in orgs


# How each model reachable by a foreign key in these forms leads to its org.
_FK_SCOPES: dict[type[Model], str] = {
    Organization: "id__in",
    RunnerGroup: "organization_id__in",
    Stack: "organization_id__in",
    # A membership may only name people already in one of the admin's orgs:
    # the full user list is not an org admin's to browse. New people join
    # through POST /orgs/{org}/members, which creates the user.
    User: "memberships__organization_id__in",
}


def scope_fk_choices(request: HttpRequest, db_field: Any, kwargs: dict[str, Any]) -> None:
    orgs = admin_org_ids(request)
    lookup = _FK_SCOPES.get(db_field.related_model)
    if orgs is not None and lookup is not None:
        kwargs["queryset"] = db_field.related_model._default_manager.filter(**{lookup: orgs}).distinct()


class ScopedAdmin(admin.ModelAdmin):
    """A ModelAdmin whose rows and permissions follow the user's admin orgs."""

    formfield_overrides = {models.JSONField: {"form_class": StorableJSONField}}

    # The path from this model to its Organization, as a query lookup.
    org_path = "organization"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        orgs = admin_org_ids(request)
        if orgs is None:
            return qs
        key = "pk__in" if self.org_path == "pk" else f"{self.org_path}_id__in"
        return qs.filter(**{key: orgs})

    def has_module_permission(self, request: HttpRequest) -> bool:
        return allowed(request, None, self.org_path)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return allowed(request, obj, self.org_path)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return allowed(request, obj, self.org_path)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return allowed(request, None, self.org_path)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # see the module docstring

    # The permission the service-calling actions ask for (``permissions=["operate"]``):
    # anyone who may see the rows may ask the services; the services decide.
    def has_operate_permission(self, request: HttpRequest) -> bool:
        return allowed(request, None, self.org_path)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        scope_fk_choices(request, db_field, kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def _apply(
        self,
        request: HttpRequest,
        objects: Iterable[Any],
        act: Callable[[Any], object],
        done_message: str,
        label: Callable[[Any], str] = str,
    ) -> None:
        """Call ``act`` on each object; a refusal is reported by name and does not stop the rest."""
        done = 0
        for obj in objects:
            try:
                act(obj)
            except GantryError as exc:
                self.message_user(request, f"{label(obj)}: {exc.detail}", messages.WARNING)
            else:
                done += 1
        if done:
            self.message_user(request, done_message.format(count=done), messages.SUCCESS)


class ReadOnlyScopedAdmin(ScopedAdmin):
    """Rows that only services change: viewable, never added or edited here."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """A read-only child table; ``parent_org_path`` leads from the *parent* to its org."""

    parent_org_path = "organization"
    extra = 0
    can_delete = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return allowed(request, obj, self.parent_org_path)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def acting_user(request: HttpRequest) -> User | None:
    return request.user if isinstance(request.user, User) else None


def adopt(obj: Model, created: Model) -> None:
    """Point the admin's unsaved instance at the row a service created.

    The admin goes on to log the addition and redirect using ``obj``.
    """
    obj.pk = created.pk
    obj._state.adding = False
    obj.refresh_from_db()


def form_validated(check: Callable[[Any], Any], value: Any) -> Any:
    """Run a ``specs`` validator, turning its refusal into a form error."""
    try:
        return check(value)
    except InvalidRequest as exc:
        raise ValidationError(exc.detail) from exc


def check_unique_name(form: forms.ModelForm, model: type[RunnerGroup] | type[Stack]) -> None:
    # The (organization, name) constraint is only checked by Django when the
    # organization is a form field; on change it is read-only, so check here
    # rather than let the service's Conflict surface as a server error.
    name = form.cleaned_data.get("name")
    org = form.cleaned_data.get("organization")
    org_id = org.id if org is not None else form.instance.organization_id
    if name and org_id:
        try:
            services.check_name_free(model, organization_id=org_id, name=name, other_than=form.instance.pk)
        except NameTaken as exc:
            form.add_error("name", exc.detail[0].upper() + exc.detail[1:] + ".")
