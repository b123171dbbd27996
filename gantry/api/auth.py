"""Who is calling: runner groups and runners (JWTs), users (API tokens, sessions).

``BearerJWTAuthentication`` verifies any Gantry JWT and turns it into a
principal by audience. Route permissions then decide whether that kind of
principal may call the route: a valid token of the wrong kind is a 403, a
forged, expired, revoked or unknown one a 401.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from gantry.core import tokens
from gantry.core.models import Membership, Organization, Role, Runner, RunnerGroup
from gantry.sql import auth as sql
from gantry.sql.rows import instance, loaded, width
from gantry.sql.statement import Statement, fetchone


@dataclass
class GroupPrincipal:
    """A runner group's coordinator, authenticated by its group JWT."""

    group: RunnerGroup
    is_authenticated: bool = True
    is_superuser: bool = False
    is_staff: bool = False
    is_active: bool = True


@dataclass
class RunnerPrincipal:
    """An ephemeral runner, bound to one run by its runner JWT."""

    runner: Runner
    run_id: uuid.UUID
    # False only on a route with runner_row_checked_by_route: the token verified,
    # the runner row not read yet; the route's own statement proves it exists.
    row_checked: bool = True
    is_authenticated: bool = True
    is_superuser: bool = False
    is_staff: bool = False
    is_active: bool = True


BEARER = "Bearer"
_BEARER = BEARER.lower().encode()


def bearer_token(header: bytes) -> str | None:
    """The token of an ``Authorization`` header's value (bytes, as sent); None when it is not a bearer one.

    Raises AuthenticationFailed (401) for a bearer header without exactly one
    token. The one reading of the header: BearerJWTAuthentication's and the
    fast lane's (gantry.server.lane), which hands a refused one to Django.
    """
    parts = header.split()
    if not parts or parts[0].lower() != _BEARER:
        return None
    if len(parts) != 2:
        raise exceptions.AuthenticationFailed("Authorization: Bearer takes exactly one token")
    return parts[1].decode("ascii", errors="replace")  # a non-ASCII token then fails to verify: a 401


class BearerJWTAuthentication(authentication.BaseAuthentication):
    keyword = BEARER

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        token = bearer_token(authentication.get_authorization_header(request))
        if token is None:
            return None
        try:
            claims = tokens.decode(token)
        except tokens.TokenInvalid as exc:
            raise exceptions.AuthenticationFailed(f"invalid token: {exc}") from None
        if claims.audience == tokens.AUD_GROUP:
            return self._group(claims), claims
        if claims.audience == tokens.AUD_RUNNER:
            view = (getattr(request, "parser_context", None) or {}).get("view")
            if getattr(view, "runner_row_checked_by_route", False):
                return self._runner_unchecked(claims), claims
            return self._runner(claims), claims
        raise exceptions.AuthenticationFailed("token audience is not accepted here")

    def _group(self, claims: tokens.Claims) -> GroupPrincipal:
        return GroupPrincipal(group=token_group(claims))

    def _runner(self, claims: tokens.Claims) -> RunnerPrincipal:
        runner_id, run_id, group_id = runner_claims(claims)
        row = fetchone(sql.RUNNER, {"runner": runner_id, "group": group_id})
        if row is None:
            raise exceptions.AuthenticationFailed("runner no longer exists")
        return RunnerPrincipal(runner=instance(Runner, row), run_id=run_id)

    def _runner_unchecked(self, claims: tokens.Claims) -> RunnerPrincipal:
        """For a route whose own statement checks the runner row (``/status``): one round trip instead of two.

        The token is verified (signature, issuer, audience, claims) but its row
        is not read: the principal carries an unsaved ``Runner(id,
        runner_group_id)`` with ``row_checked=False``, and the route answers 401
        "runner no longer exists" itself when its statement finds no such runner
        in that group. A view opts in with ``runner_row_checked_by_route = True``.
        """
        runner_id, run_id, group_id = runner_claims(claims)
        if group_id is None:
            raise exceptions.AuthenticationFailed("runner no longer exists")  # no runner is in no group
        runner = loaded(Runner, id=runner_id, runner_group_id=group_id)
        return RunnerPrincipal(runner=runner, run_id=run_id, row_checked=False)

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when credentials are missing.
        return self.keyword


_BIGINT_MIN, _BIGINT_MAX = -(2**63), 2**63 - 1
_GROUP_VERSION = [f.attname for f in RunnerGroup._meta.concrete_fields].index("token_version")


def token_group(claims: tokens.Claims) -> RunnerGroup:
    """The group of a verified group token, its organization loaded along (one read); revoked or gone: a 401."""
    group_id = _group_id(claims)
    return group_of_row(claims, fetchone(sql.GROUP, {"group": group_id}) if group_id is not None else None)


def _group_id(claims: tokens.Claims) -> int | None:
    group_id = _int(claims.subject)
    return group_id if _BIGINT_MIN <= group_id <= _BIGINT_MAX else None


def group_of_row(claims: tokens.Claims, row: Sequence[Any] | None) -> RunnerGroup:
    """The group a group token names, from its row as ``gantry.sql.auth.GROUP`` reads it; revoked or gone: a 401."""
    # A rotated token carries an old version: revoked at once, not at expiry.
    if row is None or claims.raw.get("ver") != row[_GROUP_VERSION]:
        raise exceptions.AuthenticationFailed("runner group token is revoked or its group is gone")
    group = instance(RunnerGroup, row)
    if group.archived_at is not None:
        # Its version was bumped by the archive too; this says so whatever the token claims.
        raise exceptions.AuthenticationFailed("runner group token is revoked or its group is gone")
    if "org" in claims.raw and claims.raw["org"] != group.organization_id:
        raise exceptions.AuthenticationFailed("runner group token names another organization")
    # As select_related("organization") did: the org is cached on the
    # group, so no code reaching for it (an async poll handler among them)
    # makes a query of its own.
    group.organization = instance(Organization, row, width(RunnerGroup))
    return group


def group_check(claims: tokens.Claims) -> tuple[RunnerGroup, tuple[Statement, dict[str, Any]]] | None:
    """For a token that names its org: a stand-in group (id and org) and the read that proves it, to be sent
    with the caller's own statement and judged by :func:`group_of_row`; None: the token must be read first."""
    group_id, org = _group_id(claims), claims.raw.get("org")
    if group_id is None or not isinstance(org, int) or isinstance(org, bool) or not _BIGINT_MIN <= org <= _BIGINT_MAX:
        return None
    return loaded(RunnerGroup, id=group_id, organization_id=org), (sql.GROUP, {"group": group_id})


def runner_claims(claims: tokens.Claims) -> tuple[uuid.UUID, uuid.UUID, int | None]:
    """(runner, run, group) of a verified runner token; a malformed one is a 401."""
    try:
        runner_id = uuid.UUID(claims.subject)
        run_id = uuid.UUID(str(claims.raw.get("run")))
    except ValueError:
        raise exceptions.AuthenticationFailed("malformed runner token") from None
    group = claims.raw.get("grp")
    # Gantry signs an int; anything else matches no runner (as the ORM filter did).
    ok = isinstance(group, int) and not isinstance(group, bool) and _BIGINT_MIN <= group <= _BIGINT_MAX
    return runner_id, run_id, group if ok else None


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise exceptions.AuthenticationFailed("malformed token subject") from None


class IsUser(permissions.BasePermission):
    """A person: an API token or a browser session, never a group or runner JWT."""

    message = "this route takes a user's API token or session, not a runner or group token"

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, AbstractBaseUser) and request.user.is_authenticated


class IsSuperuser(IsUser):
    message = "only a super-admin may do this"

    def has_permission(self, request: Request, view: Any) -> bool:
        return super().has_permission(request, view) and bool(getattr(request.user, "is_superuser", False))


class IsRunnerGroup(permissions.BasePermission):
    message = "this route takes a runner group token"

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, GroupPrincipal)


class IsRunner(permissions.BasePermission):
    message = "this route takes a runner token"

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, RunnerPrincipal)


def member_role(user: AbstractBaseUser, org: Organization) -> str | None:
    """The user's role in ``org``; superusers act as admins of every org."""
    if getattr(user, "is_superuser", False):
        return Role.ADMIN
    return Membership.objects.filter(user_id=user.pk, organization=org).values_list("role", flat=True).first()


class BearerScheme(OpenApiAuthenticationExtension):
    target_class = "gantry.api.auth.BearerJWTAuthentication"
    name = "bearerJWT"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "A runner group token (audience runner-group) or a runner token (audience runner).",
        }
