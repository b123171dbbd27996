"""The pages org admins and members work in (docs/queue.md): the queue, a run, the runner groups.

Server-rendered Django templates; a few lines of hand-written JavaScript
(``static/web/gantry.js``) refresh a page's live part by fetching the page
again with ``?partial=1`` and, on a run page, follow the log through the log
read API (``GET /api/v1/runs/{id}/logs``). The same scoping as the API: another
org's page is a 404, a member pressing an admin's button a 403. Every button
posts to a view here that calls the same service as the API; a refusal
(``GantryError``) comes back as a message on the page it was pressed on.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from gantry import conf
from gantry.api.auth import member_role
from gantry.core import params, services, words
from gantry.core.errors import GantryError, InvalidRequest
from gantry.core.models import (
    EXECUTING,
    NEVER_STARTED,
    PRIORITY_NAMES,
    TERMINAL,
    UNCLAIMED,
    GroupKind,
    Organization,
    Priority,
    Role,
    Run,
    Runner,
    RunnerGroup,
)
from gantry.core.services.deployments import RETRYABLE
from gantry.core.services.runs import phase_seconds, run_timings
from gantry.dispatch import coordinators, queue
from gantry.logs.reader import read_log

FINISHED_SHOWN = 20


def _user(request: HttpRequest) -> User:
    assert isinstance(request.user, User)  # login_required came first
    return request.user


def org_and_role(request: HttpRequest, slug: str) -> tuple[Organization, str]:
    """The org and the caller's role in it; 404 for a non-member, as in the API."""
    org = Organization.objects.filter(slug=slug).first()
    role = member_role(_user(request), org) if org is not None else None
    if org is None or role is None:
        raise Http404("no such organization")
    return org, role


def require_admin(role: str, why: str = "this needs the org admin role") -> None:
    """Refuse a member an org admin's action: the styled 403 page (gantry.web.errors) with ``why`` on it."""
    if role != Role.ADMIN:
        raise PermissionDenied(why)


def user_orgs(user: User) -> list[Organization]:
    qs = Organization.objects.all() if user.is_superuser else Organization.objects.filter(memberships__user=user)
    return list(qs.order_by("slug"))


def landing_org(user: User, orgs: list[Organization] | None = None) -> Organization | None:
    """The org a user lands on: the first (by slug) they are a member of; a super-admin in none, the first org.

    A super-admin sees every org, but the one they work in is theirs: landing
    on another org's queue (the first slug of all) was a surprise.
    """
    own = Organization.objects.filter(memberships__user=user).order_by("slug").first()
    if own is not None or not user.is_superuser:
        return own
    every = orgs if orgs is not None else user_orgs(user)
    return every[0] if every else None


def _nav(request: HttpRequest, org: Organization | None, role: str | None, page: str) -> dict[str, Any]:
    user = _user(request)
    orgs = user_orgs(user)
    return {
        "org": org,
        # The org whose links the nav shows: the page's own, else the user's landing org (pages outside any
        # org, such as /invitations and the error pages, keep the Queue and Runner-groups links).
        "nav_org": org if org is not None else landing_org(user, orgs),
        "role": role,
        "is_org_admin": role == Role.ADMIN,
        "page": page,
        "orgs": orgs,
        "invitation_count": len(services.pending_invitations(user)),
    }


def frame_context(request: HttpRequest) -> dict[str, Any]:
    """The nav for a page that is not an org's (an error page): nothing for an anonymous visitor."""
    if not isinstance(getattr(request, "user", None), User):
        return {}
    return _nav(request, None, None, "")


def until(seconds: float) -> str:
    """A countdown for a person ('40 s', '3 min'): rounded up, so it never says "in 2 min" of 2 min 55 s."""
    s = math.ceil(max(0.0, seconds))
    return words.duration(s if s < 120 else math.ceil(s / 60) * 60)


# ---------------------------------------------------------------- priority and place


def priority_facts(own: int, effective: int | None = None) -> dict[str, str | None]:
    """A run's priority badge: its own level, and the level the claim ranks it at now when waiting raised it."""
    aged_to = Priority(effective).label if effective is not None and effective > own else None
    return {"name": Priority(own).label, "aged_to": aged_to}


def place_line(entry: queue.QueueEntry | None) -> str | None:
    """'3rd in line for linux · about 2 min': a waiting run's place and its estimate; None without a place.

    The estimate is said only when the queue read had a basis for one
    (``expected_start_seconds`` not None): no time is better than a guess
    dressed as a fact. Zero means it goes with the next free slot: "next".
    """
    if entry is None or entry.position is None:
        return None
    line = f"{words.ordinal(entry.position)} in line"
    if entry.position_group_name:
        line += f" for {entry.position_group_name}"
    seconds = entry.expected_start_seconds
    if seconds is None:
        return line
    return f"{line} · {'next' if seconds == 0 else f'about {words.duration(seconds)}'}"


def posted_priority(request: HttpRequest, field: str) -> Priority:
    """A form's priority, by name; InvalidRequest (its detail the page's message) for anything else."""
    priority = Priority.named(request.POST.get(field, ""))
    if priority is None:
        raise InvalidRequest(f"{field} must be one of: {', '.join(PRIORITY_NAMES)}", field=field)
    return priority


def waiting_row(entry: queue.QueueEntry) -> dict[str, Any]:
    """What the queue page shows of a waiting run beyond its entry: its wait, priority badge and place."""
    return {
        "entry": entry,
        "waited": words.duration(entry.waiting_seconds),
        "priority": priority_facts(entry.run.priority, entry.effective_priority),
        "place": place_line(entry),
    }


# ---------------------------------------------------------------- home


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The site root: the user's landing org's queue, or a page saying what to do without one."""
    org = landing_org(_user(request))
    if org is not None:
        return redirect("web:queue", org=org.slug)
    return render(request, "web/no_org.html", _nav(request, None, None, "home"))


# ---------------------------------------------------------------- the queue


def queue_context(request: HttpRequest, org: Organization, role: str) -> dict[str, Any]:
    """The queue page's live part; ``?cursor=&limit=`` page the waiting runs as the API does (400 when bad)."""
    now = timezone.now()
    cursor = request.GET.get("cursor") or None
    limit = queue.page_limit(request.GET.get("limit"))
    page = queue.read_queue(org=org, now=now, cursor=cursor, limit=limit)
    running = list(
        Run.objects.filter(organization=org, status__in=sorted(EXECUTING))
        .select_related("stack", "assigned_runner__runner_group")
        .order_by("started_at", "id")[:200]
    )
    recent = Run.objects.filter(organization=org, status__in=sorted(TERMINAL)).select_related("stack")
    finished = sorted(recent.order_by("-created_at", "-id")[: FINISHED_SHOWN * 3], key=lambda r: r.finished_at or now)
    base = reverse("web:queue", kwargs={"org": org.slug})
    keep_limit = {"limit": str(limit)} if request.GET.get("limit") else {}
    return {
        "budget": page.org.budget,
        "waiting": [waiting_row(e) for e in page.entries],
        "more_waiting": page.next_cursor is not None,
        "paged": cursor is not None,
        "first_page_url": base + (f"?{urlencode(keep_limit)}" if keep_limit else ""),
        "next_page_url": f"{base}?{urlencode({'cursor': page.next_cursor, **keep_limit})}"
        if page.next_cursor
        else None,
        # The live refresh fetches the same page the user is on.
        "live_url": f"{base}?{urlencode({**({'cursor': cursor} if cursor else {}), **keep_limit, 'partial': '1'})}",
        "running": [{"run": r, "for": words.duration((now - (r.started_at or now)).total_seconds())} for r in running],
        "finished": finished[::-1][:FINISHED_SHOWN],
        "now": now,
    }


@login_required
def queue_page(request: HttpRequest, org: str) -> HttpResponse:
    organization, role = org_and_role(request, org)
    nav = _nav(request, organization, role, "queue")
    try:
        context = {**nav, **queue_context(request, organization, role)}
    except GantryError as exc:
        # A crafted ?cursor= or ?limit= is the caller's mistake: say so on a page, as a 400, never a 500.
        return render(request, "400.html", {**nav, "detail": exc.detail, "code": exc.code}, status=exc.http_status)
    template = "web/queue_live.html" if request.GET.get("partial") else "web/queue.html"
    return render(request, template, context)


RATE_MAX = 1_000_000


@login_required
@require_POST
def set_rate(request: HttpRequest, org: str) -> HttpResponse:
    organization, _ = org_and_role(request, org)
    if not _user(request).is_superuser:
        raise PermissionDenied("only a super-admin sets the dispatch rate")
    back = reverse("web:queue", kwargs={"org": organization.slug})
    try:
        limit = params.whole_number(
            request.POST.get("runs_per_hour_limit", ""), name="runs_per_hour_limit", maximum=RATE_MAX
        )
    except GantryError:
        messages.error(request, "The rate must be a whole number of runs per hour, 0 to 1,000,000.")
        return HttpResponseRedirect(back)
    services.org_set_runs_per_hour_limit(org=organization, limit=limit)
    messages.success(request, f"Dispatch rate set to {words.plural(limit, 'run')} per hour.")
    return HttpResponseRedirect(back)


# ---------------------------------------------------------------- a run


def _run_and_role(request: HttpRequest, pk: uuid.UUID) -> tuple[Run, str]:
    run = Run.objects.select_related("organization", "stack", "deployment__created_by").filter(id=pk).first()
    role = member_role(_user(request), run.organization) if run is not None else None
    if run is None or role is None:
        raise Http404("no such run")
    return run, role


# Keys of an event's or a reason's detail whose value is a run id: shown as a link to that run.
RUN_ID_KEYS = frozenset({"retry_of", "run", "run_id", "lane_holder_run_id"})
# How many missed status intervals make a runner "silent" on the run page.
SILENT_INTERVALS = 3


def _is_uuid(value: object) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def _runner_facts(run: Run, runner: Runner | None, role: str, now: datetime) -> dict[str, Any]:
    """The bound runner's last contact, whether it has gone silent, and when force-delete becomes possible.

    Silent: an executing run whose runner has not called for more than three
    status intervals (it polls ``/status`` every interval, which is what moves
    ``last_seen_at``). The gate is the service's own rule (runner_force_delete):
    last seen, or never seen, created, ``runner_force_gate`` seconds ago.
    """
    if runner is None:
        return {}
    cfg = conf.get()
    contact = runner.last_seen_at or runner.accepted_at or runner.created_at
    quiet = (now - contact).total_seconds()
    silent = run.status in EXECUTING and quiet > SILENT_INTERVALS * cfg.status_interval
    eligible_at = (runner.last_seen_at or runner.created_at) + timedelta(seconds=cfg.runner_force_gate)
    return {
        "runner_contact": contact,
        "runner_contact_ago": words.duration(quiet),
        "runner_silent": silent,
        "runner_silent_for": words.duration(quiet),
        "force_eligible_at": eligible_at,
        "force_allowed": silent and role == Role.ADMIN and now >= eligible_at,
        "force_wait": until((eligible_at - now).total_seconds()) if now < eligible_at else None,
    }


def event_text(kind: str, detail: dict[str, Any]) -> str | None:
    """An event said in a sentence where the key=value list would be cryptic; None keeps the list."""
    if kind == "priority_changed":
        by = f" by {detail['by']}" if detail.get("by") else ""
        return f"priority {detail.get('from', '?')} → {detail.get('to', '?')}{by}"
    return None


def phase_words(seconds: float) -> str:
    """A phase's length for a person: '140 ms', '2.3 s', then as :func:`words.duration` ('42 s', '7 min').

    The phases of a fast start are fractions of a second, which whole seconds would all read as "0 s"."""
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    return words.duration(seconds)


def phase_lines(run: Run, *, timings: dict[str, float | None]) -> list[tuple[str, str, str]]:
    """The run's phases said in words, each as (key, label, sentence), for the ones known so far."""
    lines = []
    queued = phase_seconds(run.created_at, run.first_pending_at)
    wait = timings["wait_seconds"]
    if wait is not None:
        behind = (
            f", after {phase_words(queued)} queued behind the stack's earlier run"
            if queued is not None and queued >= 1
            else ""
        )
        lines.append(("wait", "Waited", f"{phase_words(wait)} for a runner{behind}"))
    if timings["start_seconds"] is not None:
        lines.append(("start", "Start", f"its runner started in {phase_words(timings['start_seconds'])}"))
    if timings["first_output_seconds"] is not None:
        lines.append(("first-output", "First output", f"{phase_words(timings['first_output_seconds'])} after start"))
    if timings["run_seconds"] is not None:
        lines.append(("run", "Ran", f"{phase_words(timings['run_seconds'])}"))
    return lines


def run_context(request: HttpRequest, run: Run, role: str) -> dict[str, Any]:
    now = timezone.now()
    run_events = list(run.events.order_by("at", "id"))
    events = [
        {
            "at": e.at,
            "kind": e.kind,
            "text": event_text(e.kind, e.detail or {}),
            "detail": [
                (k, v, k in RUN_ID_KEYS and isinstance(v, str) and _is_uuid(v)) for k, v in (e.detail or {}).items()
            ],
        }
        for e in run_events
    ]
    attempts = list(
        Run.objects.filter(deployment_id=run.deployment_id).order_by("attempt").only("id", "attempt", "status")
    )
    newest = attempts[-1].id == run.id if attempts else True
    entry = queue.entry_of_run(org=run.organization, run_id=run.id, now=now)
    # The runner it is bound to, while that row exists: its group, host, last contact, a workflow run's link.
    runner = (
        Runner.objects.select_related("runner_group").filter(id=run.assigned_runner_id).first()
        if run.assigned_runner_id
        else None
    )
    started, finished = run.started_at, run.finished_at
    waiting = run.status in NEVER_STARTED
    end = finished or now
    return {
        **_nav(request, run.organization, role, "run"),
        "run": run,
        "queued_by": run.deployment.created_by,
        "events": events,
        "attempts": attempts,
        "reason": entry.reason if entry else None,
        "priority": priority_facts(run.priority, entry.effective_priority if entry else None),
        "place": place_line(entry),
        # An admin may move a run that no claim has taken yet (the service decides again when pressed).
        "can_set_priority": role == Role.ADMIN and run.status in UNCLAIMED,
        "priority_names": PRIORITY_NAMES,
        "runner": runner,
        **_runner_facts(run, runner, role, now),
        "terminal": run.status in TERMINAL,
        "waiting": waiting,
        # A log exists once a runner started the run; a run that never started has none.
        "has_log": started is not None or run.status in EXECUTING,
        # Durations, for a person: wait (queued -> started), run time, total (queued -> finished or now).
        "wait_for": words.duration(((started or end) - run.created_at).total_seconds()),
        "run_for": words.duration((end - started).total_seconds()) if started else None,
        "total_for": words.duration((end - run.created_at).total_seconds()),
        "phases": phase_lines(run, timings=run_timings(run)),
        # Buttons as the run's state allows; the services decide again when pressed.
        "can_cancel": run.status not in TERMINAL,
        "can_skip": newest and run.status in NEVER_STARTED,
        "can_retry": newest and run.status in RETRYABLE,
    }


@login_required
def run_page(request: HttpRequest, pk: uuid.UUID) -> HttpResponse:
    run, role = _run_and_role(request, pk)
    template = "web/run_live.html" if request.GET.get("partial") else "web/run.html"
    return render(request, template, run_context(request, run, role))


def _act(request: HttpRequest, back: str, act: Callable[[], object], done: str) -> HttpResponse:
    try:
        act()
    except GantryError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, done)
    return HttpResponseRedirect(back)


@login_required
@require_POST
def run_action(request: HttpRequest, pk: uuid.UUID, action: str) -> HttpResponse:
    """Cancel, skip, retry: members may, as in the API. Force-deleting the run's runner: org admins."""
    run, role = _run_and_role(request, pk)
    by = _user(request)
    back = reverse("web:run", kwargs={"pk": run.id})
    if action == "cancel":
        return _act(
            request, back, lambda: services.run_request_cancellation(run_id=run.id, by=by), "Cancellation asked."
        )
    if action == "skip":
        return _act(request, back, lambda: services.deployment_skip(deployment_id=run.deployment_id, by=by), "Skipped.")
    if action == "retry":
        try:
            services.deployment_retry(deployment_id=run.deployment_id, by=by)
        except GantryError as exc:
            messages.error(request, exc.detail)
            return HttpResponseRedirect(back)
        # The new attempt's page is where the user wants to be next.
        newest = Run.objects.filter(deployment_id=run.deployment_id).order_by("-attempt").values_list("id", flat=True)
        messages.success(request, "Retried: a new attempt is queued.")
        return redirect("web:run", pk=newest[0])
    if action == "force-delete-runner":
        require_admin(role, "force-deleting a runner needs the org admin role")
        # The run's own runner, never one named by the form: the run's org scoping covers it.
        runner_id = run.assigned_runner_id
        if runner_id is None:
            messages.error(request, "This run has no runner to force-delete.")
            return HttpResponseRedirect(back)
        return _act(
            request,
            back,
            lambda: services.runner_force_delete(runner_id=runner_id, by=by),
            f"Runner {runner_id} force-deleted; the run it was executing failed and its stack's queue moves on.",
        )
    raise Http404("no such action")


@login_required
@require_POST
def run_priority(request: HttpRequest, pk: uuid.UUID) -> HttpResponse:
    """Change a waiting run's priority (an org admin, as ``PATCH /api/v1/runs/{id}``); back to its page."""
    run, role = _run_and_role(request, pk)
    require_admin(role, "changing a run's priority needs the org admin role")
    back = reverse("web:run", kwargs={"pk": run.id})

    def change() -> None:
        # A run claimed (or finished) since the page was drawn is refused (run_not_waiting): nothing changes.
        services.run_set_priority(run_id=run.id, priority=posted_priority(request, "priority"), by=_user(request))

    return _act(request, back, change, f"Priority set to {request.POST.get('priority')}.")


@login_required
def run_log_download(request: HttpRequest, pk: uuid.UUID) -> StreamingHttpResponse:
    """The whole log as plain text (an attachment): the read API's pages, concatenated."""
    run, _ = _run_and_role(request, pk)

    def pages() -> Iterator[bytes]:
        offset = 0
        while True:
            page = read_log(run, offset=offset)
            if page.text:
                yield page.text.encode()
            # A running run's log ends where its runner has got to; a page that adds nothing ends the download.
            if page.final or page.next_offset <= offset:
                return
            offset = page.next_offset

    response = StreamingHttpResponse(pages(), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.id}.log"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


# ---------------------------------------------------------------- runner groups


def groups_context(request: HttpRequest, org: Organization, role: str) -> dict[str, Any]:
    from gantry.web import group_pages  # it builds on this module's helpers

    now = timezone.now()
    stale = conf.get().poll_stale_after
    facts = queue.group_facts(organization_id=org.id)  # archived groups are not among them
    found = coordinators.of_groups([g.id for g in facts])
    rows = []
    for g in facts:
        if g.last_polled_at is None:
            poll = "never polled"
            online = False
        else:
            silent = (now - g.last_polled_at).total_seconds()
            online = silent <= stale
            poll = "coordinator online" if online else f"silent for {words.duration(silent)}"
        polled = group_pages.coordinator_rows(None if found is None else found.get(g.id), now=now, stale=stale)
        summary = group_pages.coordinator_summary(polled)
        rows.append({"group": g, "poll": poll, "online": online, "coordinators": summary})
    return {
        **_nav(request, org, role, "groups"),
        "groups": rows,
        "stale_after": stale,
        "coordinators_unknown": found is None,
        "kinds": [(k.value, k.label) for k in GroupKind],
    }


@login_required
def groups_page(request: HttpRequest, org: str) -> HttpResponse:
    organization, role = org_and_role(request, org)
    template = "web/groups_live.html" if request.GET.get("partial") else "web/groups.html"
    return render(request, template, groups_context(request, organization, role))


@login_required
@require_POST
def group_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    group = RunnerGroup.objects.select_related("organization").filter(id=pk, archived_at__isnull=True).first()
    role = member_role(_user(request), group.organization) if group is not None else None
    if group is None or role is None:
        raise Http404("no such runner group")
    require_admin(role)
    if action == "archive":
        from gantry.web import group_pages

        return group_pages.archive(request, group, role)
    # Back where the button was: the group's own page, or the groups list.
    if request.POST.get("from") == "group":
        back = reverse("web:group", kwargs={"pk": group.id})
    else:
        back = reverse("web:groups", kwargs={"org": group.organization.slug})
    if action in ("drain", "undrain"):
        drained = action == "drain"
        return _act(
            request,
            back,
            lambda: services.runner_group_set_drained(group=group, drained=drained),
            f"{group.name} {'drained' if drained else 'undrained'}.",
        )
    if action == "rotate-token":
        token = services.runner_group_rotate_token(group=group)
        # Shown once (the message lives in the session until this redirect shows it); Gantry keeps no copy.
        messages.warning(
            request, f"New token for {group.name} (shown once, copy it now; the old one stopped working): {token}"
        )
        return HttpResponseRedirect(back)
    raise Http404("no such action")
