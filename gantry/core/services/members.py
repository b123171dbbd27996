"""People in orgs: invitations an existing user accepts, and the one-time link a new user sets a password with.

- A user created by an org (``membership_set`` for an unknown username) is a
  member at once and gets a set-password link: Django's password-reset token
  (``default_token_generator``), valid for ``PASSWORD_RESET_TIMEOUT`` seconds
  (``GANTRY_PASSWORD_LINK_TTL``) and good for one use: it hashes the
  password, so setting one spends it. Gantry keeps no copy.
- Someone who already has an account is never attached without consent: the
  org gets an :class:`~gantry.core.models.Invitation`, pending until that user
  accepts it (``/invitations`` page, ``POST /invitations/{id}/accept``).
- An org admin may re-issue a link only for an account nobody has claimed
  yet (no usable password) and that belongs to no org the admin does not
  administer: otherwise a link would let one org's admin take over a person
  who is also somewhere else. Re-issuing resets the unusable password, which
  changes the hash every earlier link was made from, so they stop working.
- An org never loses its last admin: removing (or demoting) the one
  membership with the admin role is refused with ``last_admin``, whoever asks
  (another admin, the admin leaving, a super-admin). :func:`_keep_an_admin`
  holds the rule for both; it locks the org's admin memberships, so two
  admins removing each other at once cannot both succeed. A super-admin acts
  as admin of every org but is not counted: an org needs an admin of its own.
- Anyone may leave an org (remove their own membership), an admin included
  while another admin remains; removing someone else is an org admin's.
- A user's API token is a plain DRF token (``rest_framework.authtoken``,
  ``Authorization: Token <key>``); :func:`api_token_regenerate` replaces it,
  so the old key stops working at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from rest_framework.authtoken.models import Token

from gantry.core.errors import AccountClaimed, Forbidden, LastAdmin, NotFound
from gantry.core.models import Invitation, Membership, Organization, Role


@dataclass(frozen=True)
class PasswordLink:
    path: str  # relative; the view makes it absolute for the request's host
    expires_at: datetime


def password_link(user: User, *, now: datetime | None = None) -> PasswordLink:
    """A one-time link for ``user`` to set a password (Django's password-reset token)."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    expires = (now or timezone.now()) + timedelta(seconds=settings.PASSWORD_RESET_TIMEOUT)
    return PasswordLink(path=reverse("web:set_password", args=[uid, token]), expires_at=expires)


def password_link_reissue(*, org: Organization, username: str, by: User) -> PasswordLink:
    """A new set-password link for a member of ``org`` who has not set a password yet; earlier links die."""
    user = User.objects.filter(username=username, memberships__organization=org).first()
    if user is None:
        raise NotFound("no member of this organization has that username")
    if user.has_usable_password():
        raise AccountClaimed(
            f"{username} has set a password already; a forgotten one is reset by a super-admin "
            "(manage.py changepassword)"
        )
    if not by.is_superuser:
        foreign = Membership.objects.filter(user=user).exclude(
            organization__in=Membership.objects.filter(user=by, role=Role.ADMIN).values("organization")
        )
        if user.is_superuser or foreign.exists():
            raise Forbidden(f"{username} also belongs to an organization you do not administer")
    with transaction.atomic():
        user.set_unusable_password()  # a new hash: every link made before stops working
        user.save(update_fields=["password"])
    return password_link(user)


def invitation_set(*, org: Organization, user: User, role: str, by: User | None = None) -> Invitation:
    """Invite an existing user (or change the role a pending invitation offers)."""
    invitation, created = Invitation.objects.get_or_create(
        user=user, organization=org, defaults={"role": role, "invited_by": by}
    )
    if not created and invitation.role != role:
        invitation.role = role
        invitation.save(update_fields=["role"])
    return invitation


def pending_invitations(user: User) -> list[Invitation]:
    return list(Invitation.objects.filter(user=user).select_related("organization", "invited_by"))


def grant(*, org: Organization, user: User, role: str) -> tuple[Membership, bool]:
    """Make ``user`` a member with ``role`` (caller has the user's consent, or created the user)."""
    with transaction.atomic():
        membership, created = Membership.objects.get_or_create(user=user, organization=org, defaults={"role": role})
        demoted = not created and membership.role == Role.ADMIN and role != Role.ADMIN
        if not created and membership.role != role:
            if role != Role.ADMIN:
                _keep_an_admin(org=org, membership=membership)
            membership.role = role
            membership.save(update_fields=["role"])
    if role == Role.ADMIN and not user.is_staff:
        # Org admins work in the Django admin too (scoped to their orgs).
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    elif demoted:
        _unstaff_if_admin_nowhere(user)
    return membership, created


def _unstaff_if_admin_nowhere(user: User) -> None:
    """Clear ``is_staff`` of a former org admin who is no longer one anywhere (demoted or removed).

    Staff came with the admin role (:func:`grant`) and goes with the last one:
    the Django admin would show such a user nothing, and staff also sees the
    readiness probe's error details. Super-admins keep theirs.
    """
    if user.is_staff and not user.is_superuser and not Membership.objects.filter(user=user, role=Role.ADMIN).exists():
        user.is_staff = False
        user.save(update_fields=["is_staff"])


def invitation_accept(*, invitation_id: int, user: User) -> Membership:
    """The invited user says yes: a membership with the offered role; the invitation is gone."""
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update().select_related("organization").filter(id=invitation_id, user=user)
        ).first()
        if invitation is None:
            raise NotFound("no pending invitation of yours has that id")
        membership, _ = grant(org=invitation.organization, user=user, role=invitation.role)
        invitation.delete()
    return membership


def invitation_decline(*, invitation_id: int, user: User) -> None:
    deleted, _ = Invitation.objects.filter(id=invitation_id, user=user).delete()
    if not deleted:
        raise NotFound("no pending invitation of yours has that id")


def _keep_an_admin(*, org: Organization, membership: Membership) -> None:
    """Refuse (``last_admin``) to let ``membership`` stop being an admin when it is the org's only one.

    The one place the rule lives: removal and demotion both call it, inside
    their transaction, before they write. It locks every admin membership of
    the org (in id order, so two callers never deadlock) until that
    transaction ends: of two admins removing each other at once, the second
    waits, then reads the admins as the first left them, and is refused.
    """
    admins = list(
        Membership.objects.select_for_update()
        .filter(organization=org, role=Role.ADMIN)
        .order_by("id")
        .values_list("id", flat=True)
    )
    if admins == [membership.id]:
        raise LastAdmin(
            f"{membership.user.get_username()} is the last admin of {org.slug}: make someone else admin first"
        )


def membership_remove(*, org: Organization, username: str, by: User) -> None:
    """Take ``username`` out of ``org``: their membership and their pending invitation to it.

    An org admin removes anyone (a pending invitation alone, too: that
    revokes it); anyone else only themselves (leaving). Never the org's last
    admin (``last_admin``).
    """
    with transaction.atomic():
        membership = Membership.objects.filter(organization=org, user__username=username).select_related("user").first()
        invitations = Invitation.objects.filter(organization=org, user__username=username)
        leaving = membership is not None and membership.user_id == by.pk
        if (
            not leaving
            and not by.is_superuser
            and not Membership.objects.filter(organization=org, user=by, role=Role.ADMIN).exists()
        ):
            raise Forbidden("removing another member needs the org admin role")
        if membership is None:
            deleted, _ = invitations.delete()
            if not deleted:
                raise NotFound("no member of this organization has that username")
            return
        _keep_an_admin(org=org, membership=membership)
        # Deleted by id: if another removal took the row meanwhile, this is a no-op, not an error.
        Membership.objects.filter(id=membership.id).delete()
        invitations.delete()
        if membership.role == Role.ADMIN:
            _unstaff_if_admin_nowhere(membership.user)


def api_token_regenerate(*, user: User) -> str:
    """Replace ``user``'s API token with a new one and answer its key (shown once): the old key stops working."""
    with transaction.atomic():
        Token.objects.filter(user=user).delete()
        return str(Token.objects.create(user=user).key)
