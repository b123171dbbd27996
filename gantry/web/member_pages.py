"""The members page (``/orgs/<slug>/members``) and a user's own account page (``/account``), docs/queue.md.

The same services as the API: inviting is ``membership_invite`` (a username
or an email; an existing account is invited, a new person gets an account and
a one-time set-password link), changing a role is ``membership_set``, removing
is ``membership_remove`` (never the org's last admin: its refusal comes back
as a message), regenerating one's API token is ``api_token_regenerate``.
Secrets made here (a set-password link, a new API token) are shown once: in a
message that lives in the session until the redirect shows it; Gantry keeps
no copy beyond what Django's password hash and DRF's token table hold.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.messages.views import SuccessMessageMixin
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse, reverse_lazy
from django.views.decorators.http import require_POST
from rest_framework.authtoken.models import Token

from gantry.api.auth import member_role
from gantry.core import services
from gantry.core.errors import GantryError
from gantry.core.models import Invitation, Membership, Role
from gantry.web.pages import _nav, _user, org_and_role, require_admin, user_orgs


@login_required
def members_page(request: HttpRequest, org: str) -> HttpResponse:
    organization, role = org_and_role(request, org)
    context = {
        **_nav(request, organization, role, "members"),
        "members": Membership.objects.filter(organization=organization)
        .select_related("user")
        .order_by("user__username"),
        "invitations": Invitation.objects.filter(organization=organization)
        .select_related("user", "invited_by")
        .order_by("created_at", "id"),
        "roles": Role.values,
    }
    return render(request, "web/members.html", context)


@login_required
@require_POST
def member_invite(request: HttpRequest, org: str) -> HttpResponse:
    organization, role = org_and_role(request, org)
    require_admin(role)
    back = reverse("web:members", kwargs={"org": organization.slug})
    who = request.POST.get("who", "").strip()
    wanted = request.POST.get("role", "")
    try:
        change = services.membership_invite(org=organization, who=who, role=wanted, by=_user(request))
    except GantryError as exc:
        messages.error(request, exc.detail)
        return HttpResponseRedirect(back)
    if change.invitation is not None:
        name = change.invitation.user.get_username()
        messages.success(
            request,
            f"Invited {name} as {change.invitation.role}: they join once they accept on their Invitations page.",
        )
    elif change.created and change.password_link is not None:
        assert change.membership is not None
        link = request.build_absolute_uri(change.password_link.path)
        expires = change.password_link.expires_at.strftime("%Y-%m-%d %H:%M UTC")
        # Shown once: the message lives in the session until the redirect shows it.
        messages.warning(
            request,
            f"{change.membership.user.get_username()} has an account and is a {change.membership.role} now. "
            f"Send them this one-time link to set a password (shown once; valid until {expires}): {link}",
        )
    else:
        assert change.membership is not None
        messages.success(request, f"{change.membership.user.get_username()} is {change.membership.role} now.")
    return HttpResponseRedirect(back)


@login_required
@require_POST
def member_action(request: HttpRequest, org: str, username: str, action: str) -> HttpResponse:
    """Change a member's role, or remove them (an admin's), or leave (one's own membership)."""
    organization, role = org_and_role(request, org)
    user = _user(request)
    back = reverse("web:members", kwargs={"org": organization.slug})
    if action not in ("role", "remove"):
        raise Http404("no such action")
    leaving = action == "remove" and username == user.get_username()
    if not leaving:
        require_admin(role)
    try:
        if action == "role":
            wanted = request.POST.get("role", "")
            if not Membership.objects.filter(organization=organization, user__username=username).exists():
                raise Http404("no member of this organization has that username")
            services.membership_set(org=organization, username=username, role=wanted, by=user)
            messages.success(request, f"{username} is {wanted} now.")
        else:
            services.membership_remove(org=organization, username=username, by=user)
            if leaving and member_role(user, organization) is None:
                messages.success(request, f"You left {organization.slug}.")
                return HttpResponseRedirect(reverse("web:home"))
            messages.success(request, f"{username} was removed from {organization.slug}.")
    except GantryError as exc:
        messages.error(request, exc.detail)
    return HttpResponseRedirect(back)


# ---------------------------------------------------------------- the account page


def _account_nav(request: HttpRequest) -> dict[str, Any]:
    """The nav of a page that belongs to no org: the user's first org's links, so the nav stays whole."""
    orgs = user_orgs(_user(request))
    org = orgs[0] if orgs else None
    return _nav(request, org, member_role(_user(request), org) if org is not None else None, "account")


@login_required
def account_page(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    context = {
        **_account_nav(request),
        "memberships": Membership.objects.filter(user=user)
        .select_related("organization")
        .order_by("organization__slug"),
        "token": Token.objects.filter(user=user).first(),
    }
    return render(request, "web/account.html", context)


@login_required
@require_POST
def account_token(request: HttpRequest) -> HttpResponse:
    key = services.api_token_regenerate(user=_user(request))
    # Shown once (the message lives in the session until this redirect shows it); DRF's token table holds the key.
    messages.warning(
        request,
        f"Your new API token (shown once, copy it now; the old one stopped working): {key}",
        extra_tags="token",
    )
    return HttpResponseRedirect(reverse("web:account"))


class PasswordChange(SuccessMessageMixin, auth_views.PasswordChangeView):
    """Django's own password change (the old password, then the new one twice), in Gantry's page."""

    template_name = "web/password_change.html"
    success_url = reverse_lazy("web:account")
    success_message = "Password changed."

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), **_account_nav(self.request)}


password_change = PasswordChange.as_view()
