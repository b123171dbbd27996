"""Logging in and out, setting a first password from a one-time link, and answering invitations.

Login, logout and the set-password form are Django's own views
(``django.contrib.auth.views``) with Gantry's templates; the link is Django's
password-reset token (``gantry.core.services.members``). After setting a
password the user is logged in and lands on their queue.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse, reverse_lazy
from django.views.decorators.http import require_POST

from gantry.core import services
from gantry.core.errors import GantryError
from gantry.web.pages import _nav

login = auth_views.LoginView.as_view(template_name="web/login.html", redirect_authenticated_user=True)
logout = auth_views.LogoutView.as_view()
set_password = auth_views.PasswordResetConfirmView.as_view(
    template_name="web/set_password.html",
    post_reset_login=True,
    success_url=reverse_lazy("web:home"),
)


@login_required
def invitations(request: HttpRequest) -> HttpResponse:
    assert isinstance(request.user, User)
    context = {**_nav(request, None, None, "invitations"), "invitations": services.pending_invitations(request.user)}
    return render(request, "web/invitations.html", context)


@login_required
@require_POST
def invitation_answer(request: HttpRequest, pk: int, answer: str) -> HttpResponse:
    assert isinstance(request.user, User)
    if answer not in ("accept", "decline"):
        raise Http404("no such answer")
    try:
        if answer == "accept":
            membership = services.invitation_accept(invitation_id=pk, user=request.user)
            messages.success(request, f"You joined {membership.organization.slug} as {membership.role}.")
            return HttpResponseRedirect(reverse("web:queue", kwargs={"org": membership.organization.slug}))
        services.invitation_decline(invitation_id=pk, user=request.user)
        messages.info(request, "Invitation declined.")
    except GantryError as exc:
        messages.error(request, exc.detail)
    return HttpResponseRedirect(reverse("web:invitations"))
