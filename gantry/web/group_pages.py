"""A runner group's page, creating a group, archiving one, force-deleting its runners (docs/queue.md).

``/runner-groups/<id>`` shows the group, its runners (the rows that are its
slots) and its coordinators (who polls it, as they name themselves on the
poll: gantry.dispatch.coordinators). The same scoping as the API: another
org's group is a 404, a member pressing an admin's button a 403. Every button
calls the service the API calls; a refusal (GantryError) comes back as a
message on the page.

A new group's token is shown once, on the new group's page: it is kept in the
creating admin's session for that one redirect and dropped as the page shows
it (as rotate-token's message is), never stored anywhere else.
"""

from __future__ import annotations

import shlex
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from gantry import conf
from gantry.api.auth import member_role
from gantry.api.runner_admin_views import runners_with_run
from gantry.core import services
from gantry.core.errors import GantryError, InvalidRequest
from gantry.core.models import GroupKind, RunnerGroup
from gantry.dispatch import coordinators
from gantry.web.pages import _nav, _user, org_and_role, require_admin

# The session key holding a just-created group's token until its page shows it.
NEW_TOKEN_KEY = "gantry_new_group_token"


def group_and_role(request: HttpRequest, pk: int) -> tuple[RunnerGroup, str]:
    """The group and the caller's role in its org; 404 for a non-member (or no such group)."""
    group = RunnerGroup.objects.select_related("organization").filter(id=pk).first()
    role = member_role(_user(request), group.organization) if group is not None else None
    if group is None or role is None:
        raise Http404("no such runner group")
    return group, role


# ---------------------------------------------------------------- coordinators, as a page shows them


def coordinator_rows(
    found: list[coordinators.Coordinator] | None, *, now: datetime, stale: int
) -> list[dict[str, Any]]:
    """A group's recorded coordinators for a page: each with ``silent`` (no poll for ``stale`` seconds)."""
    return [{"c": c, "silent": (now - c.last_poll).total_seconds() > stale} for c in (found or [])]


def coordinator_summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    silent = sum(1 for r in rows if r["silent"])
    return {"total": len(rows), "online": len(rows) - silent, "silent": silent}


# ---------------------------------------------------------------- ready-to-paste commands


def coordinator_commands(*, server: str, group: RunnerGroup, token: str) -> list[dict[str, str]]:
    """One command per launcher (docs/runners.md, docs/launchers.md) that starts a coordinator for ``group``.

    For a github_actions group, which has no coordinator, the one thing to
    check instead (its workflow, docs/github-actions.md).
    """
    if group.kind == GroupKind.GITHUB_ACTIONS:
        workflow = f"{group.github_owner}/{group.github_repo}/.github/workflows/{group.github_workflow}"
        return [
            {
                "launcher": "github_actions",
                "note": "No coordinator: Gantry's backend dispatcher starts a workflow run for each run of this "
                "group. Keep the token only for the group-token calls (it cannot poll). Make sure this "
                f"workflow exists at {group.github_ref}:",
                "command": workflow,
            }
        ]
    export = f"export GANTRY_GROUP_TOKEN={shlex.quote(token)}"
    base = f"python -m runners.coordinator --server {shlex.quote(server)}"
    parallel = f"--max-parallel {min(group.max_concurrent_runs, 64)}"
    state = shlex.quote(f"/var/lib/gantry-coordinator/{_safe(group.name)}")
    return [
        {
            "launcher": "local",
            "note": "Each run's runner is a process on this host.",
            "command": f"{export}\n{base} --launcher local \\\n    {parallel} --state-dir {state}",
        },
        {
            "launcher": "docker",
            "note": "Each run gets a fresh container (the runner image from docs/launchers.md).",
            "command": f"{export}\n{base} --launcher docker \\\n    --launcher-option image=gantry-runner:local "
            f"{parallel} --state-dir {state}",
        },
        {
            "launcher": "kubernetes",
            "note": "Each run gets a Pod of its own; put your registry's runner image here.",
            "command": f"{export}\n{base} --launcher kubernetes \\\n"
            "    --launcher-option image=registry.example.com/gantry:latest \\\n"
            f"    --launcher-option namespace=gantry-runners {parallel}",
        },
    ]


def _safe(name: str) -> str:
    """A group name as one path segment (letters, digits, '-', '_', '.')."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in name) or "group"


# ---------------------------------------------------------------- the group page


def group_context(request: HttpRequest, group: RunnerGroup, role: str) -> dict[str, Any]:
    now = timezone.now()
    cfg = conf.get()
    gate = timedelta(seconds=cfg.runner_force_gate)
    runners = []
    for r in runners_with_run(group):
        seen = r.last_seen_at or r.created_at
        runners.append({"runner": r, "deletable_at": seen + gate, "deletable": now >= seen + gate})
    found = coordinators.of_groups([group.id])
    rows = coordinator_rows(None if found is None else found.get(group.id), now=now, stale=cfg.poll_stale_after)
    polled = group.last_polled_at
    return {
        **_nav(request, group.organization, role, "groups"),
        "group": group,
        "runners": runners,
        "coordinators": rows,
        "coordinators_unknown": found is None,
        "summary": coordinator_summary(rows),
        # A poll more recent than every identified coordinator's: one that does not name itself polls too.
        "unidentified_poll": polled
        if polled is not None
        and (now - polled).total_seconds() <= cfg.poll_stale_after
        and not any(not r["silent"] for r in rows)
        else None,
        "group_silent": polled is None or (now - polled).total_seconds() > cfg.poll_stale_after,
        "stale_after": cfg.poll_stale_after,
        "force_gate": cfg.runner_force_gate,
        "archived": group.archived_at is not None,
        "now": now,
    }


@login_required
def group_page(request: HttpRequest, pk: int) -> HttpResponse:
    group, role = group_and_role(request, pk)
    context = group_context(request, group, role)
    if request.GET.get("partial"):
        return render(request, "web/group_live.html", context)
    created = request.session.get(NEW_TOKEN_KEY)
    if isinstance(created, dict) and created.get("group_id") == group.id:
        # Shown once: gone from the session as this page renders it.
        del request.session[NEW_TOKEN_KEY]
        context["new_token"] = created["token"]
        context["commands"] = coordinator_commands(
            server=request.build_absolute_uri("/").rstrip("/"), group=group, token=created["token"]
        )
    return render(request, "web/group.html", context)


# ---------------------------------------------------------------- admin buttons


def archive(request: HttpRequest, group: RunnerGroup, role: str) -> HttpResponse:
    """The group page's "Archive group" (pages.group_action routes it here): services.runner_group_archive."""
    require_admin(role)
    try:
        services.runner_group_archive(group=group)
    except GantryError as exc:
        messages.error(request, exc.detail)
        return HttpResponseRedirect(reverse("web:group", kwargs={"pk": group.id}))
    messages.success(request, f"{group.name} archived: its token no longer works and it left the lists.")
    return HttpResponseRedirect(reverse("web:groups", kwargs={"org": group.organization.slug}))


@login_required
@require_POST
def runner_force_delete(request: HttpRequest, pk: int, runner_id: uuid.UUID) -> HttpResponse:
    group, role = group_and_role(request, pk)
    require_admin(role)
    if not group.runners.filter(id=runner_id).exists():
        raise Http404("no such runner in this group")
    back = reverse("web:group", kwargs={"pk": group.id})
    try:
        failed = services.runner_force_delete(runner_id=runner_id, by=_user(request))
    except GantryError as exc:
        messages.error(request, exc.detail)
        return HttpResponseRedirect(back)
    messages.success(
        request,
        f"Runner {runner_id} force-deleted" + (f"; its run {failed} failed (force_deleted)." if failed else "."),
    )
    return HttpResponseRedirect(back)


# ---------------------------------------------------------------- creating a group

_KINDS = {GroupKind.SELF_HOSTED.value, GroupKind.GITHUB_ACTIONS.value}


def parse_labels(raw: str) -> dict[str, str]:
    """``key=value`` pairs, one per line or comma-separated; InvalidRequest names a malformed one."""
    labels: dict[str, str] = {}
    for part in raw.replace(",", "\n").splitlines():
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise InvalidRequest(f"labels: {part!r} is not key=value")
        if key.strip() in labels:
            raise InvalidRequest(f"labels: {key.strip()!r} is given twice")
        labels[key.strip()] = value.strip()
    return labels


def create_fields(post: Any) -> dict[str, Any]:
    """The create form's fields as runner_group_create takes them (the API's RunnerGroupCreateSerializer's)."""
    name = (post.get("name") or "").strip()
    if not name or len(name) > 100:
        raise InvalidRequest("name: 1 to 100 characters")
    kind = post.get("kind") or GroupKind.SELF_HOSTED
    if kind not in _KINDS:
        raise InvalidRequest(f"kind: one of {', '.join(sorted(_KINDS))}")
    raw_slots = (post.get("max_concurrent_runs") or "10").strip()
    if not (raw_slots.isascii() and raw_slots.isdigit() and len(raw_slots) <= 6 and 1 <= int(raw_slots) <= 100_000):
        raise InvalidRequest("slots: a whole number from 1 to 100000")
    fields: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "labels": parse_labels(post.get("labels") or ""),
        "max_concurrent_runs": int(raw_slots),
    }
    if kind == GroupKind.GITHUB_ACTIONS:
        for key, limit in (("github_owner", 100), ("github_repo", 100), ("github_workflow", 200), ("github_ref", 200)):
            value = (post.get(key) or "").strip()
            if len(value) > limit:
                raise InvalidRequest(f"{key}: at most {limit} characters")
            fields[key] = value
    return fields


@login_required
@require_POST
def group_create(request: HttpRequest, org: str) -> HttpResponse:
    organization, role = org_and_role(request, org)
    require_admin(role)
    back = reverse("web:groups", kwargs={"org": organization.slug})
    try:
        group, token = services.runner_group_create(org=organization, **create_fields(request.POST))
    except GantryError as exc:
        messages.error(request, f"The group was not created: {exc.detail}")
        return HttpResponseRedirect(back)
    request.session[NEW_TOKEN_KEY] = {"group_id": group.id, "token": token}
    messages.success(request, f"Runner group {group.name} created.")
    return redirect("web:group", pk=group.id)
