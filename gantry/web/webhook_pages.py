"""The webhooks page (``/orgs/<slug>/webhooks``, docs/webhooks.md): an org admin's endpoints and their deliveries.

The same services as the API (``gantry.webhooks.services``): adding checks the
URL, the events and the secret and stores nothing on a refusal (its reason
comes back as a message); the secret is sealed at once and never shown again.
Admins only, as in the API: a member gets 403.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from gantry.core.errors import GantryError
from gantry.core.models import WEBHOOK_EVENTS, Organization, WebhookEndpoint
from gantry.web.pages import _nav, _user, org_and_role, require_admin
from gantry.webhooks import services

# The page shows fewer deliveries per endpoint than the API route.
PAGE_RECENT = 10


def admin_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view(request, organization, role, ...)`` for an org admin: 404 for a non-member, 403 for a member."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, org: str, **kwargs: Any) -> HttpResponse:
        organization, role = org_and_role(request, org)
        require_admin(role)
        return view(request, organization, role, **kwargs)

    return login_required(wrapped)


@admin_only
def webhooks_page(request: HttpRequest, organization: Organization, role: str) -> HttpResponse:
    endpoints = list(organization.webhooks.order_by("id"))
    recent = services.recent_deliveries(endpoints, PAGE_RECENT)
    context = {
        **_nav(request, organization, role, "webhooks"),
        "endpoints": [(e, recent[e.pk]) for e in endpoints],
        "events": WEBHOOK_EVENTS,
        "secret_min": services.SECRET_MIN,
        "secret_max": services.SECRET_MAX,
    }
    return render(request, "web/webhooks.html", context)


@require_POST
@admin_only
def webhook_add(request: HttpRequest, organization: Organization, role: str) -> HttpResponse:
    try:
        endpoint = services.endpoint_create(
            org=organization,
            url=request.POST.get("url", "").strip(),
            events=request.POST.getlist("events"),
            secret=request.POST.get("secret", ""),
            user=_user(request),
        )
    except GantryError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, f"Added {endpoint.url}.")
    return HttpResponseRedirect(reverse("web:webhooks", kwargs={"org": organization.slug}))


@require_POST
@admin_only
def webhook_delete(request: HttpRequest, organization: Organization, role: str, pk: int) -> HttpResponse:
    endpoint = WebhookEndpoint.objects.filter(organization=organization, pk=pk).first()
    if endpoint is None:
        raise Http404("no such webhook")
    services.endpoint_delete(endpoint)
    messages.success(request, f"Deleted {endpoint.url}.")
    return HttpResponseRedirect(reverse("web:webhooks", kwargs={"org": organization.slug}))
