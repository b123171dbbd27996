"""Columns and fields of the admin that need a word of their own (``gantry.web.admin`` uses them).

- Times with seconds: Django's default date format drops them, and a run's
  events are often seconds apart.
- ``created_at`` has a database default, so an unsaved object holds a
  ``DatabaseDefault`` marker, not a time: add forms leave the field out.
- JSON fields (labels, specs, secrets) are shown back escaped to ASCII and
  refused when the database could not store them (``gantry.core.jsonsafe``):
  a lone surrogate typed as ``\ud800`` must come back as a form error, not
  break the page that shows the form again.
- Archived groups and stacks leave the lists by default, as on the pages
  and in the API; the "archived" filter shows them on request.
- The runs list's reason and runner-group columns are read once per page, for
  the page's rows (the queue's ladder, two statements per org on the page; the
  runs' ``assigned`` events), and kept on the row objects of that request.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from gantry.core import jsonsafe
from gantry.core.models import WAITING, RunEvent, RunnerGroup
from gantry.dispatch import queue

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices  # the stubs' name for one choice


class ArchivedFilter(admin.SimpleListFilter):
    """Live rows unless asked: the default (no parameter) leaves archived ones out, unlike Django's "All"."""

    title = "archived"
    parameter_name = "archived"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Archived"), ("all", "All")]

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "Live",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "all":
            return queryset
        return queryset.filter(archived_at__isnull=self.value() != "yes")


class ArchivedReadOnly(admin.ModelAdmin):
    """An archived row (a group or a stack) is history: its page shows it, and takes no change.

    As in the API, where a change of an archived group is 404 and of an
    archived stack 409 ``stack_archived``.
    """

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.archived_at is not None:
            return False
        return super().has_change_permission(request, obj)


class StorableJSONField(forms.JSONField):
    """A form JSON field that refuses what PostgreSQL cannot store, and redisplays any input safely."""

    def to_python(self, value: Any) -> Any:
        parsed = super().to_python(value)
        why = jsonsafe.problem(parsed)
        if why is not None:
            raise forms.ValidationError(why)
        return parsed

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            # The user's own text, shown back: escape what UTF-8 cannot carry.
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return json.dumps(value, ensure_ascii=True, cls=self.encoder)


def seconds(at: datetime | None) -> str:
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S") if at else "-"


class NoCreatedAtOnAdd:
    """Leaves ``created_at`` out of add forms (the database fills it in)."""

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)  # type: ignore[misc]
        return [f for f in fields if f != "created_at"] if obj is None else fields


class RunColumns:
    """The runs list's runner group and reason columns."""

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        cl: ChangeList = super().get_changelist_instance(request)  # type: ignore[misc]
        rows = list(cl.result_list)
        now = timezone.now()
        by_org: defaultdict[int, list[Any]] = defaultdict(list)
        for run in rows:
            if run.status in WAITING:
                by_org[run.organization_id].append(run)
        reasons: dict[Any, dict[str, Any]] = {}
        for runs in by_org.values():
            reasons.update(queue.reasons_of_runs(org=runs[0].organization, run_ids=[r.id for r in runs], now=now))
        assigned = dict(
            RunEvent.objects.filter(run_id__in=[r.id for r in rows], kind="assigned")
            .order_by("run_id", "at", "id")
            .values_list("run_id", "detail__runner_group_id")
        )  # the last assignment of each run wins
        names = {
            g.id: str(g)
            for g in RunnerGroup.objects.select_related("organization").filter(id__in=set(assigned.values()))
        }
        for run in rows:
            found = reasons.get(run.id)
            run._gantry_reason = f"{found['code']}: {found['detail']}" if found else "-"
            group_id = assigned.get(run.id)
            run._gantry_group = names.get(int(group_id), "-") if group_id is not None else "-"
        return cl

    @admin.display(description="reason")
    def reason(self, run: Any) -> str:
        return str(getattr(run, "_gantry_reason", "-"))

    @admin.display(description="runner group")
    def runner_group(self, run: Any) -> str:
        # The last group the run was assigned to: its runner row may be gone, the event stays.
        return str(getattr(run, "_gantry_group", "-"))
