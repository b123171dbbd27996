"""What every API view shares: who is calling, the org scoping rule, body validation, and the OpenAPI error entries.

Scoping rule: an object of an org the caller is not a member of answers 404
(its existence never leaks); a member without the needed role gets 403.
Runner calls add the run binding: a runner token used on another run's or
another runner's path is refused with 403 ``run_binding``.

The user API (``views``), the runner protocol (``runner_views``), the log
routes (``gantry.logs.views``) and the admin views all import these by name.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Model, QuerySet
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.views import APIView

from gantry.api.auth import GroupPrincipal, IsUser, RunnerPrincipal, member_role
from gantry.core.errors import Forbidden, InvalidRequest, NotFound, RunBinding
from gantry.core.models import Organization, Role

M = TypeVar("M", bound=Model)


# ---------------------------------------------------------------- callers


# A route for people: an API token or a browser session, never a group or runner
# JWT. (A comment, not a docstring: drf-spectacular would print a docstring as
# the description of every route that has none of its own.)
class UserView(APIView):
    permission_classes = [IsUser]


def user_of(request: Request) -> User:
    # IsUser has admitted only real users to the views that call this.
    assert isinstance(request.user, User)
    return request.user


def group_of(request: Request) -> GroupPrincipal:
    assert isinstance(request.user, GroupPrincipal)
    return request.user


def runner_of(
    request: Request, *, run_id: uuid.UUID | None = None, runner_id: uuid.UUID | None = None
) -> RunnerPrincipal:
    """The calling runner, after the run binding: path ids must be the token's."""
    principal = request.user
    assert isinstance(principal, RunnerPrincipal)
    if run_id is not None and run_id != principal.run_id:
        raise RunBinding("this runner token is bound to another run")
    if runner_id is not None and runner_id != principal.runner.id:
        raise RunBinding("this runner token belongs to another runner")
    return principal


# ---------------------------------------------------------------- scoping


def check_role(request: Request, org: Organization, *, admin: bool) -> None:
    """404 for a non-member (existence never leaks), 403 for a member without the admin role when it is needed."""
    role = member_role(user_of(request), org)
    if role is None:
        raise NotFound("not found")
    if admin and role != Role.ADMIN:
        raise Forbidden("this needs the org admin role")


def org_for(request: Request, slug: str, *, admin: bool = False) -> Organization:
    org = Organization.objects.filter(slug=slug).first()
    if org is None:
        raise NotFound("organization not found")
    check_role(request, org, admin=admin)
    return org


def scoped(request: Request, qs: QuerySet[M], pk: Any, *, org_path: str, admin: bool = False) -> M:
    """Fetch ``qs.get(pk=pk)`` and check the caller's role in its org (``org_path`` leads there)."""
    try:
        obj = qs.select_related(org_path).get(pk=pk)
    except (ObjectDoesNotExist, ValueError, TypeError):  # ValueError: a malformed uuid
        raise NotFound("not found") from None
    org = obj
    for part in org_path.split("__"):
        org = getattr(org, part)
    assert isinstance(org, Organization)
    check_role(request, org, admin=admin)
    return obj


# ---------------------------------------------------------------- bodies


def validated(serializer_class: type[serializers.Serializer], request: Request, **kw: Any) -> dict[str, Any]:
    """The request body checked by ``serializer_class``: 400 for a body that is not an object, or any field error."""
    if not isinstance(request.data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    ser = serializer_class(data=request.data, **kw)
    ser.is_valid(raise_exception=True)
    return dict(ser.validated_data)


# ---------------------------------------------------------------- OpenAPI error entries


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable error code; part of the contract (docs/api.md).")
    detail = serializers.CharField(help_text="What went wrong, for a person.")


_USER_ERRORS = {
    400: "invalid request",
    401: "no or invalid credentials",
    403: "wrong token type or role",
    404: "not found (or not yours)",
    409: "the object's state refuses this; see `code` and `detail`",
    422: "the Idempotency-Key was used for another request (`idempotency_key_reused`)",
}
_RUNNER_ERRORS = {
    401: "no, invalid or revoked token",
    403: "wrong token type, or a runner token used for another run or runner",
    404: "not found",
    409: "the run or runner is not in a state that allows this; see `code` and `detail`",
}


def error_responses(*codes: int, texts: dict[int, str] | None = None) -> dict[int, OpenApiResponse]:
    """The OpenAPI entries for a route's error answers; ``texts`` words them for the route family."""
    wording = {**_USER_ERRORS, **(texts or {})}
    return {code: OpenApiResponse(ErrorSerializer, description=wording[code]) for code in codes}


def user_errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Error entries worded for the user and admin routes."""
    return error_responses(*codes)


def runner_errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Error entries worded for the runner-group and runner routes."""
    return error_responses(*codes, texts=_RUNNER_ERRORS)
