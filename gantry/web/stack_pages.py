"""The stack pages (docs/queue.md, "The pages"): an org's stacks, one stack and its history; deploy, run again, archive.

The same scoping and services as the API (``gantry.api.views``): another org's
stack or run is a 404; deploying is a member's (the stack's own spec), running
an earlier deployment's spec again and archiving are an org admin's, whose
buttons a member does not see and gets a 403 for if posted anyway. A refusal
of the service (``GantryError``: no default spec, an archived stack, a busy
one) comes back as a message on the page the button was pressed on.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import OuterRef, Q, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from gantry import conf
from gantry.api.auth import member_role
from gantry.core import services, specs
from gantry.core.errors import GantryError, InvalidRequest
from gantry.core.models import PRIORITY_NAMES, TERMINAL, Deployment, Membership, Priority, Role, Run, RunStatus, Stack
from gantry.core.services.deployments import may_queue_priority
from gantry.core.words import duration
from gantry.dispatch import queue
from gantry.web.pages import _act, _nav, _user, org_and_role, posted_priority, require_admin

HISTORY_PAGE = 20
# The finished runs an org admin may pick a spec from, on the stack page.
SPEC_CHOICES = 10
USERNAME_MAX = 150  # Django's own limit on User.username


def _stack_and_role(request: HttpRequest, pk: int) -> tuple[Stack, str]:
    stack = Stack.objects.select_related("organization").filter(id=pk).first()
    role = member_role(_user(request), stack.organization) if stack is not None else None
    if stack is None or role is None:
        raise Http404("no such stack")
    return stack, role


def same_spec(deployment_spec: Any, stack: Stack) -> bool:
    """Whether a deployment ran the stack's current spec (both in canonical form, as the services store them)."""
    return bool(stack.spec) and deployment_spec == specs.validate_spec(stack.spec)


# ---------------------------------------------------------------- the stacks


@login_required
def stacks_page(request: HttpRequest, org: str) -> HttpResponse:
    """The org's live stacks, each with its last run: two statements for them, whatever their number."""
    organization, role = org_and_role(request, org)
    last_run = Run.objects.filter(stack_id=OuterRef("pk")).order_by("-created_at", "-id").values("id")[:1]
    stacks = list(
        Stack.objects.filter(organization=organization, archived_at__isnull=True)
        .annotate(last_run_id=Subquery(last_run))
        .order_by("name")
    )
    runs = Run.objects.in_bulk([s.last_run_id for s in stacks if s.last_run_id is not None])
    rows = [{"stack": s, "last": runs.get(s.last_run_id)} for s in stacks]
    context = {**_nav(request, organization, role, "stacks"), "rows": rows}
    return render(request, "web/stacks.html", context)


# ---------------------------------------------------------------- one stack


@dataclass(frozen=True)
class HistoryRow:
    run: Run
    queued_by: str
    wait: str  # queued → started
    run_time: str  # started → finished
    total: str  # queued → finished


def _span(start: datetime | None, end: datetime | None, now: datetime) -> str:
    """How long from ``start`` to ``end``; "… so far" while it goes on, "-" when it never began."""
    if start is None:
        return "-"
    if end is None:
        return f"{duration((now - start).total_seconds())} so far"
    return duration((end - start).total_seconds())


def history_row(run: Run, now: datetime) -> HistoryRow:
    creator = run.deployment.created_by
    finished = run.finished_at if run.status in TERMINAL else None
    # A run that finished without starting (cancelled, skipped, timed out) never waited its way to a start.
    wait = _span(run.created_at, run.started_at, now) if run.started_at or finished is None else "-"
    return HistoryRow(
        run=run,
        queued_by=creator.get_username() if creator is not None else "-",
        wait=wait,
        run_time=_span(run.started_at, finished, now),
        total=_span(run.created_at, finished, now),
    )


@dataclass(frozen=True)
class HistoryFilter:
    status: str
    by: str
    after: tuple[datetime, uuid.UUID] | None


def history_filter(request: HttpRequest) -> HistoryFilter:
    """The history's query string, checked: InvalidRequest (a 400 page) for what no link of the page makes."""
    status = request.GET.get("status", "")
    if status and status not in RunStatus.values:
        raise InvalidRequest(f"status must be one of: {', '.join(RunStatus.values)}", field="status")
    by = request.GET.get("by", "")
    if len(by) > USERNAME_MAX:
        raise InvalidRequest(f"by must be a username (at most {USERNAME_MAX} characters)", field="by")
    # Checked and in UTC (queue.decode_cursor), as the queue's own cursors.
    after = queue.decode_cursor(request.GET.get("cursor"))
    return HistoryFilter(status=status, by=by, after=after)


def history(stack: Stack, f: HistoryFilter, now: datetime) -> tuple[list[HistoryRow], str | None]:
    """One page of the stack's runs, newest first, keyset-paged by (created_at, id): one statement."""
    qs = Run.objects.filter(stack_id=stack.id).select_related("deployment__created_by")
    if f.status:
        qs = qs.filter(status=f.status)
    if f.by:
        qs = qs.filter(deployment__created_by__username=f.by)
    if f.after is not None:
        at, run_id = f.after
        # created_at <= at bounds the range; the OR breaks ties inside one instant (as GET /orgs/{org}/runs).
        qs = qs.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=run_id), created_at__lte=at)
    runs = list(qs.order_by("-created_at", "-id")[: HISTORY_PAGE + 1])
    more = len(runs) > HISTORY_PAGE
    runs = runs[:HISTORY_PAGE]
    cursor = queue.encode_cursor(runs[-1].created_at, runs[-1].id) if more else None
    return [history_row(r, now) for r in runs], cursor


def spec_summary(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    if not spec:
        return None
    return {
        "steps": [step["name"] for step in spec.get("steps", [])],
        "env": sorted(spec.get("env", {})),
        "timeout_seconds": spec.get("timeout_seconds"),
    }


def spec_choices(stack: Stack) -> list[dict[str, Any]]:
    """The stack's last finished runs, whose specs an org admin may deploy again: one statement."""
    runs = (
        Run.objects.filter(stack_id=stack.id, status__in=sorted(TERMINAL))
        .select_related("deployment")
        .order_by("-created_at", "-id")[:SPEC_CHOICES]
    )
    return [{"run": r, "current": same_spec(r.deployment.spec, stack)} for r in runs]


@dataclass(frozen=True)
class PriorityChoice:
    value: str  # what the form posts: a priority's name, or "" for the stack's default
    label: str
    selected: bool


def deploy_priorities(stack: Stack, *, admin: bool) -> list[PriorityChoice]:
    """The deploy form's priorities: those the caller may queue (the API's rule), the stack's default selected.

    A member on a stack whose default is high may still deploy at that
    default (as the API's deployment that names no priority does): it is
    offered as "" ("the stack's default"), never as a "high" they may not post.
    """
    default = stack.default_priority
    choices = [PriorityChoice(p.label, p.label, p == default) for p in Priority if may_queue_priority(p, admin=admin)]
    if not any(c.selected for c in choices):
        choices.append(PriorityChoice("", f"{Priority(default).label} (the stack's default)", True))
    return choices


@login_required
def stack_page(request: HttpRequest, pk: int) -> HttpResponse:
    stack, role = _stack_and_role(request, pk)
    now = timezone.now()
    context: dict[str, Any] = {
        **_nav(request, stack.organization, role, "stacks"),
        "stack": stack,
        "selector": stack.runner_selector,
        "secret_names": sorted(stack.secrets),  # names only: values are Fernet tokens, never shown
        "spec": spec_summary(stack.spec),
        "statuses": RunStatus.values,
        "members": list(
            Membership.objects.filter(organization=stack.organization)
            .order_by("user__username")
            .values_list("user__username", flat=True)
        ),
        "spec_choices": spec_choices(stack) if role == Role.ADMIN and stack.archived_at is None else [],
        "priority_choices": deploy_priorities(stack, admin=role == Role.ADMIN),
        "default_priority": Priority(stack.default_priority).label,
        "priority_names": PRIORITY_NAMES,
        "aging": duration(conf.get().priority_aging_seconds),
        "now": now,
    }
    try:
        f = history_filter(request)
    except InvalidRequest as exc:
        context.update(error=exc.detail, filter=None, rows=[], older=None)
        return render(request, "web/stack.html", context, status=400)
    rows, older = history(stack, f, now)
    context.update(filter=f, rows=rows, older=older, filtered=bool(f.status or f.by))
    return render(request, "web/stack.html", context)


def _deploy(
    request: HttpRequest, stack: Stack, spec: dict[str, Any] | None, back: str, priority: int | None, role: str
) -> HttpResponse:
    """Queue the deployment at ``priority`` (None: the stack's default); to its run's page, or back with the refusal.

    Who may queue which priority is the API's rule (``check_queue_priority``): a member's forged "high" is refused
    here with its message, and nothing is queued.
    """
    try:
        services.check_queue_priority(priority, admin=role == Role.ADMIN)
        deployment = services.deployment_create(stack=stack, spec=spec, priority=priority, created_by=_user(request))
    except GantryError as exc:
        messages.error(request, exc.detail)
        return HttpResponseRedirect(back)
    run = Run.objects.filter(deployment=deployment).order_by("-attempt").values_list("id", "status")[0]
    messages.success(request, f"Deployed {stack.name}: its run is {run[1]}.")
    return redirect("web:run", pk=run[0])


def _back(request: HttpRequest, stack: Stack) -> str:
    """The page the form was on: the stacks list (its forms say so) or the stack's own page."""
    if request.POST.get("from") == "stacks":
        return reverse("web:stacks", kwargs={"org": stack.organization.slug})
    return reverse("web:stack", kwargs={"pk": stack.id})


@login_required
@require_POST
def deploy(request: HttpRequest, pk: int) -> HttpResponse:
    """Deploy the stack's own spec (a member), or an earlier run's (``spec_from_run``, an org admin)."""
    stack, role = _stack_and_role(request, pk)
    back = _back(request, stack)
    try:
        # Empty (or absent, as on the stacks list): the stack's default, as a deployment that names none.
        priority = posted_priority(request, "priority") if request.POST.get("priority") else None
    except InvalidRequest as exc:
        messages.error(request, exc.detail)
        return HttpResponseRedirect(back)
    spec_from_run = request.POST.get("spec_from_run", "")
    if not spec_from_run:
        return _deploy(request, stack, None, back, priority, role)
    # As the API's spec_override_forbidden: the steps run with the stack's secrets.
    require_admin(role, "only an org admin may deploy an earlier run's spec")
    try:
        run_id = uuid.UUID(spec_from_run)
    except ValueError:
        messages.error(request, "Pick one of the stack's runs to take the spec from.")
        return HttpResponseRedirect(back)
    deployment = Deployment.objects.filter(runs__id=run_id, stack_id=stack.id).first()
    if deployment is None:
        messages.error(request, "That run is not one of this stack's.")
        return HttpResponseRedirect(back)
    return _deploy(request, stack, deployment.spec, back, priority, role)


@login_required
@require_POST
def set_default_priority(request: HttpRequest, pk: int) -> HttpResponse:
    """The stack's ``default_priority`` (an org admin, as ``PATCH /api/v1/stacks/{id}``)."""
    stack, role = _stack_and_role(request, pk)
    require_admin(role)
    back = reverse("web:stack", kwargs={"pk": stack.id})

    def change() -> None:
        services.stack_update(stack=stack, default_priority=posted_priority(request, "default_priority"))

    name = request.POST.get("default_priority")
    return _act(request, back, change, f"Deployments of {stack.name} that name no priority now queue at {name}.")


@login_required
@require_POST
def archive(request: HttpRequest, pk: int) -> HttpResponse:
    stack, role = _stack_and_role(request, pk)
    require_admin(role)
    try:
        services.stack_archive(stack_id=stack.id, by=_user(request))
    except GantryError as exc:
        messages.error(request, exc.detail)
        return redirect("web:stack", pk=stack.id)
    messages.success(
        request, f"Stack {stack.name} archived: its waiting runs were cancelled; its history stays on its page."
    )
    return redirect("web:stacks", org=stack.organization.slug)


# ---------------------------------------------------------------- run again (on a run's page)


@dataclass(frozen=True)
class RunAgain:
    """What the run page's "Run again" offers: shown or not, and why not."""

    allowed: bool
    note: str


def run_again_state(run: Run, is_admin: bool) -> RunAgain:
    """A finished run of a live stack may run again: by anyone with the stack's current spec, else by an admin."""
    if run.status not in TERMINAL:
        return RunAgain(False, "")
    if run.stack.archived_at is not None:
        return RunAgain(False, "The stack is archived: it takes no new deployment.")
    if not may_queue_priority(run.priority, admin=is_admin):
        # Run again keeps the run's priority, and the one rule says who may queue it.
        return RunAgain(False, f"This run was queued {Priority(run.priority).label}: only an org admin may queue that.")
    if same_spec(run.deployment.spec, run.stack) or is_admin:
        return RunAgain(True, "")
    why = "The stack's spec has changed since this run" if run.stack.spec else "The stack has no default spec"
    return RunAgain(False, f"{why}: only an org admin may run this spec again.")


@login_required
@require_POST
def run_again(request: HttpRequest, pk: uuid.UUID) -> HttpResponse:
    """A new deployment of the run's stack with the run's spec and priority (docs/queue.md, "Run again")."""
    run = Run.objects.select_related("organization", "stack", "deployment").filter(id=pk).first()
    role = member_role(_user(request), run.organization) if run is not None else None
    if run is None or role is None:
        raise Http404("no such run")
    back = reverse("web:run", kwargs={"pk": run.id})
    if run.status not in TERMINAL:
        messages.error(request, f"Only a finished run can be run again; this one is {run.status}.")
        return HttpResponseRedirect(back)
    if same_spec(run.deployment.spec, run.stack):
        # The stack's own spec: any member may, as a Deploy of the stack.
        return _deploy(request, run.stack, None, back, run.priority, role)
    require_admin(role, "the stack's spec has changed since this run: only an org admin may run it again")
    return _deploy(request, run.stack, run.deployment.spec, back, run.priority, role)
