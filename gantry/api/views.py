"""The user and admin API (docs/api.md). Views authenticate, scope (``gantry.api.common``), and call services."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gantry.api import serializers as s
from gantry.api.auth import IsSuperuser, IsUser, member_role
from gantry.api.common import UserView, org_for, scoped, user_errors, user_of, validated
from gantry.core import services
from gantry.core.errors import PriorityForbidden, SpecOverrideForbidden
from gantry.core.models import Deployment, Membership, Organization, Role, Run, RunnerGroup, Stack

# The deployment POST's retry key (the IETF httpapi Idempotency-Key header).
IDEMPOTENCY_HEADER = "Idempotency-Key"

# ---------------------------------------------------------------- orgs


class OrgListView(UserView):
    def get_permissions(self) -> list[Any]:
        return [IsSuperuser()] if self.request.method == "POST" else [IsUser()]

    @extend_schema(
        operation_id="orgs_list", responses={200: s.OrganizationSerializer(many=True), **user_errors(401, 403)}
    )
    def get(self, request: Request) -> Response:
        qs = Organization.objects.all()
        if not request.user.is_superuser:
            qs = qs.filter(memberships__user=user_of(request))
        return Response(s.OrganizationSerializer(qs, many=True).data)

    @extend_schema(
        operation_id="orgs_create",
        request=s.OrganizationCreateSerializer,
        responses={201: s.OrganizationSerializer, **user_errors(400, 401, 403, 409)},
        description="Create an organization (super-admin).",
    )
    def post(self, request: Request) -> Response:
        data = validated(s.OrganizationCreateSerializer, request)
        org = services.org_create(slug=data["slug"], name=data["name"])
        return Response(s.OrganizationSerializer(org).data, status=status.HTTP_201_CREATED)


class OrgDetailView(UserView):
    @extend_schema(operation_id="orgs_read", responses={200: s.OrganizationSerializer, **user_errors(401, 403, 404)})
    def get(self, request: Request, org: str) -> Response:
        return Response(s.OrganizationSerializer(org_for(request, org)).data)

    @extend_schema(
        operation_id="orgs_update",
        request=s.OrganizationUpdateSerializer,
        responses={200: s.OrganizationSerializer, **user_errors(400, 401, 403, 404)},
        description="Change the name or the default runner group (org admin). runs_per_hour_limit is read-only here.",
    )
    def patch(self, request: Request, org: str) -> Response:
        organization = org_for(request, org, admin=True)
        data = validated(s.OrganizationUpdateSerializer, request)
        organization = services.org_update(org=organization, **data)
        return Response(s.OrganizationSerializer(organization).data)


class RunsPerHourLimitView(APIView):
    permission_classes = [IsSuperuser]

    @extend_schema(
        operation_id="orgs_set_runs_per_hour_limit",
        request=s.RunsPerHourLimitSerializer,
        responses={200: s.OrganizationSerializer, **user_errors(400, 401, 403, 404)},
        description="Set the org's dispatch rate (super-admin); clears dispatch_throttled_until in the same write.",
    )
    def put(self, request: Request, org: str) -> Response:
        organization = org_for(request, org)
        data = validated(s.RunsPerHourLimitSerializer, request)
        organization = services.org_set_runs_per_hour_limit(org=organization, limit=data["runs_per_hour_limit"])
        return Response(s.OrganizationSerializer(organization).data)


class MemberListView(UserView):
    @extend_schema(
        operation_id="orgs_members_list", responses={200: s.MemberSerializer(many=True), **user_errors(401, 403, 404)}
    )
    def get(self, request: Request, org: str) -> Response:
        organization = org_for(request, org)
        rows = Membership.objects.filter(organization=organization).select_related("user").order_by("user__username")
        return Response([{"username": m.user.get_username(), "role": m.role} for m in rows])

    @extend_schema(
        operation_id="orgs_members_set",
        request=s.MemberSerializer,
        responses={
            201: s.MemberCreatedSerializer,
            202: OpenApiResponse(s.MemberInvitedSerializer, description="an existing user was invited"),
            200: OpenApiResponse(s.MemberSerializer, description="role of an existing member changed"),
            **user_errors(400, 401, 403, 404, 409),
        },
        description="Add a user (created if new) with a role, or change a member's role (org admin). A user "
        "created by this call is a member at once; the answer carries their API token and a one-time link to set "
        "a password, shown once. Someone who already has an account is invited instead (202): they join once "
        "they accept (POST /invitations/{id}/accept). Demoting the org's last admin is refused (409 last_admin). "
        "Usernames follow Django's rule: letters, digits, @ . + - _.",
    )
    def post(self, request: Request, org: str) -> Response:
        organization = org_for(request, org, admin=True)
        data = validated(s.MemberSerializer, request)
        change = services.membership_set(
            org=organization, username=data["username"], role=data["role"], by=user_of(request)
        )
        if change.invitation is not None:
            body: dict[str, Any] = {
                "username": data["username"],
                "role": change.invitation.role,
                "invitation_id": change.invitation.id,
                "status": "invited",
            }
            return Response(body, status=status.HTTP_202_ACCEPTED)
        assert change.membership is not None
        body = {"username": change.membership.user.get_username(), "role": change.membership.role}
        if change.api_token:
            body["token"] = change.api_token
        if change.password_link is not None:
            body["set_password_url"] = request.build_absolute_uri(change.password_link.path)
            body["set_password_expires_at"] = change.password_link.expires_at
        return Response(
            s.MemberCreatedSerializer(body).data,
            status=status.HTTP_201_CREATED if change.created else status.HTTP_200_OK,
        )


class MemberPasswordLinkView(UserView):
    @extend_schema(
        operation_id="orgs_members_password_link",
        request=None,
        responses={200: s.PasswordLinkSerializer, **user_errors(401, 403, 404, 409)},
        description="Re-issue a member's one-time set-password link (org admin); earlier links stop working. Only "
        "for an account whose password was never set (409 account_claimed otherwise) and that belongs to no org "
        "the caller does not administer (403).",
    )
    def post(self, request: Request, org: str, username: str) -> Response:
        organization = org_for(request, org, admin=True)
        link = services.password_link_reissue(org=organization, username=username, by=user_of(request))
        body = {"set_password_url": request.build_absolute_uri(link.path), "set_password_expires_at": link.expires_at}
        return Response(s.PasswordLinkSerializer(body).data)


class MemberDetailView(UserView):
    @extend_schema(
        operation_id="orgs_members_remove",
        request=None,
        responses={204: None, **user_errors(401, 403, 404, 409)},
        description="Remove a member from the org (org admin), with their pending invitation to it; for someone "
        "only invited, this revokes the invitation. Any member may remove themselves (leave). Never the org's last "
        "admin: 409 last_admin (make another member admin first). 403 for a member removing someone else, 404 "
        "for a username that is neither a member nor invited.",
    )
    def delete(self, request: Request, org: str, username: str) -> Response:
        organization = org_for(request, org)
        services.membership_remove(org=organization, username=username, by=user_of(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationListView(UserView):
    @extend_schema(
        operation_id="invitations_list",
        responses={200: s.InvitationSerializer(many=True), **user_errors(401, 403)},
        description="Your pending invitations (any user).",
    )
    def get(self, request: Request) -> Response:
        return Response(s.InvitationSerializer(services.pending_invitations(user_of(request)), many=True).data)


@extend_schema_view(post=extend_schema(operation_id="invitations_accept"))
class InvitationAcceptView(UserView):
    accept = True

    @extend_schema(
        request=None,
        responses={200: s.MemberSerializer, 204: None, **user_errors(401, 403, 404)},
        description="Accept (200, the membership) or decline (204) one of your pending invitations; another "
        "user's invitation is 404.",
    )
    def post(self, request: Request, pk: int) -> Response:
        user = user_of(request)
        if not self.accept:
            services.invitation_decline(invitation_id=pk, user=user)
            return Response(status=status.HTTP_204_NO_CONTENT)
        membership = services.invitation_accept(invitation_id=pk, user=user)
        return Response({"username": user.get_username(), "role": membership.role})


@extend_schema_view(post=extend_schema(operation_id="invitations_decline"))
class InvitationDeclineView(InvitationAcceptView):
    accept = False


# ---------------------------------------------------------------- runner groups


class RunnerGroupListView(UserView):
    @extend_schema(
        operation_id="runner_groups_list",
        responses={200: s.RunnerGroupSerializer(many=True), **user_errors(401, 403, 404)},
    )
    def get(self, request: Request, org: str) -> Response:
        organization = org_for(request, org)
        groups = organization.runner_groups.filter(archived_at__isnull=True)
        return Response(s.RunnerGroupSerializer(groups, many=True).data)

    @extend_schema(
        operation_id="runner_groups_create",
        request=s.RunnerGroupCreateSerializer,
        responses={201: s.RunnerGroupWithTokenSerializer, **user_errors(400, 401, 403, 404, 409)},
        description="Create a runner group (org admin). The answer carries its token, shown once.",
    )
    def post(self, request: Request, org: str) -> Response:
        organization = org_for(request, org, admin=True)
        data = validated(s.RunnerGroupCreateSerializer, request)
        group, token = services.runner_group_create(org=organization, **data)
        return Response({**s.RunnerGroupSerializer(group).data, "token": token}, status=status.HTTP_201_CREATED)


def _group(request: Request, pk: int, *, admin: bool = False, archived: bool = False) -> RunnerGroup:
    """The group ``pk`` in the caller's org; an archived one only for reading (``archived``), else 404."""
    groups = RunnerGroup.objects.all() if archived else RunnerGroup.objects.filter(archived_at__isnull=True)
    return scoped(request, groups, pk, org_path="organization", admin=admin)


class RunnerGroupDetailView(UserView):
    @extend_schema(
        operation_id="runner_groups_read", responses={200: s.RunnerGroupSerializer, **user_errors(401, 403, 404)}
    )
    def get(self, request: Request, pk: int) -> Response:
        # An archived group stays readable here (its archived_at set): its runs' history names it.
        return Response(s.RunnerGroupSerializer(_group(request, pk, archived=True)).data)

    @extend_schema(
        operation_id="runner_groups_update",
        request=s.RunnerGroupUpdateSerializer,
        responses={200: s.RunnerGroupSerializer, **user_errors(400, 401, 403, 404, 409)},
    )
    def patch(self, request: Request, pk: int) -> Response:
        group = _group(request, pk, admin=True)
        data = validated(s.RunnerGroupUpdateSerializer, request, partial=True)
        return Response(s.RunnerGroupSerializer(services.runner_group_update(group=group, **data)).data)

    @extend_schema(
        operation_id="runner_groups_archive",
        request=None,
        responses={204: None, **user_errors(401, 403, 404, 409)},
        description="Archive the group (org admin): every token of it is refused (401) at once, it leaves the "
        "groups list, the queue and the claim, and its idle runners go; its runs stay readable, and GET on it "
        "still answers (archived_at set). Refused with 409 `group_busy` while one of its runners holds a run "
        "(assigned or executing). An archived group is 404 to every other call.",
    )
    def delete(self, request: Request, pk: int) -> Response:
        services.runner_group_archive(group=_group(request, pk, admin=True))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunnerGroupRotateTokenView(UserView):
    @extend_schema(
        operation_id="runner_groups_rotate_token",
        request=None,
        responses={200: s.TokenSerializer, **user_errors(401, 403, 404)},
        description="Issue a new group token (org admin); every older token stops working at once.",
    )
    def post(self, request: Request, pk: int) -> Response:
        token = services.runner_group_rotate_token(group=_group(request, pk, admin=True))
        return Response({"token": token})


@extend_schema_view(post=extend_schema(operation_id="runner_groups_drain"))
class RunnerGroupDrainView(UserView):
    drained = True

    @extend_schema(
        request=None,
        responses={200: s.RunnerGroupSerializer, **user_errors(401, 403, 404)},
        description="Stop (drain) or resume (undrain) dispatch to the group (org admin). Runs in flight finish.",
    )
    def post(self, request: Request, pk: int) -> Response:
        group = services.runner_group_set_drained(group=_group(request, pk, admin=True), drained=self.drained)
        return Response(s.RunnerGroupSerializer(group).data)


@extend_schema_view(post=extend_schema(operation_id="runner_groups_undrain"))
class RunnerGroupUndrainView(RunnerGroupDrainView):
    drained = False


# ---------------------------------------------------------------- stacks and deployments


class StackListView(UserView):
    @extend_schema(
        operation_id="stacks_list", responses={200: s.StackSerializer(many=True), **user_errors(401, 403, 404)}
    )
    def get(self, request: Request, org: str) -> Response:
        organization = org_for(request, org)
        # Archived stacks leave the list; GET /stacks/{id} still answers them.
        return Response(s.StackSerializer(organization.stacks.filter(archived_at__isnull=True), many=True).data)

    @extend_schema(
        operation_id="stacks_create",
        request=s.StackCreateSerializer,
        responses={201: s.StackSerializer, **user_errors(400, 401, 403, 404, 409)},
        description="Create a stack (org admin). Labels under gantry:runner-group: form its runs' selector.",
    )
    def post(self, request: Request, org: str) -> Response:
        organization = org_for(request, org, admin=True)
        data = validated(s.StackCreateSerializer, request)
        stack = services.stack_create(org=organization, **data)
        return Response(s.StackSerializer(stack).data, status=status.HTTP_201_CREATED)


def _stack(request: Request, pk: int, *, admin: bool = False) -> Stack:
    return scoped(request, Stack.objects.all(), pk, org_path="organization", admin=admin)


class StackDetailView(UserView):
    @extend_schema(operation_id="stacks_read", responses={200: s.StackSerializer, **user_errors(401, 403, 404)})
    def get(self, request: Request, pk: int) -> Response:
        return Response(s.StackSerializer(_stack(request, pk)).data)

    @extend_schema(
        operation_id="stacks_update",
        request=s.StackUpdateSerializer,
        responses={200: s.StackSerializer, **user_errors(400, 401, 403, 404, 409)},
        description="Change a stack (org admin). Runs already created keep the selector they were created with. "
        "409 stack_archived for an archived stack.",
    )
    def patch(self, request: Request, pk: int) -> Response:
        stack = _stack(request, pk, admin=True)
        data = validated(s.StackUpdateSerializer, request, partial=True)
        return Response(s.StackSerializer(services.stack_update(stack=stack, **data)).data)

    @extend_schema(
        operation_id="stacks_archive",
        request=None,
        responses={204: None, **user_errors(401, 403, 404, 409)},
        description="Archive the stack (org admin): its waiting (queued, pending) runs are cancelled, it leaves the "
        "stacks list and the queue, and deploying it answers 409 stack_archived. Its deployments and finished runs "
        "stay readable, and this route still answers it, with archived_at. 409 stack_busy while a run of it is "
        "claimed or executing (assigned, running, stopping). Archiving an archived stack changes nothing (204).",
    )
    def delete(self, request: Request, pk: int) -> Response:
        stack = _stack(request, pk, admin=True)
        services.stack_archive(stack_id=stack.id, by=user_of(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeploymentListView(UserView):
    @extend_schema(
        operation_id="deployments_list",
        responses={200: s.DeploymentSerializer(many=True), **user_errors(401, 403, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        stack = _stack(request, pk)
        deployments = stack.deployments.prefetch_related("runs")[:100]
        return Response(s.DeploymentSerializer(deployments, many=True).data)

    @extend_schema(
        operation_id="deployments_create",
        request=s.DeploymentCreateSerializer,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="Makes a retry safe: a POST repeated with the same key (same stack, user and spec) "
                "queues nothing new and answers the deployment the first one made, with `Idempotent-Replayed: true`. "
                "1-255 visible ASCII characters; kept with the deployment.",
            )
        ],
        responses={201: s.DeploymentSerializer, **user_errors(400, 401, 403, 404, 409, 422)},
        description="Queue a deployment (org member). Its run is pending when the stack's lane is free, else queued. "
        "A `spec` of its own (overriding the stack's) needs the org admin role: 403 `spec_override_forbidden`. "
        "`priority` (low, normal, high) orders its run in the queue; it defaults to the stack's `default_priority`, "
        "and `high` needs the org admin role: 403 `priority_forbidden`. 409 `stack_archived` for an archived stack. "
        "With an `Idempotency-Key` header, a retry answers the first deployment (201, `Idempotent-Replayed: true`); "
        "the key reused for another spec or by another user is 422 `idempotency_key_reused`.",
    )
    def post(self, request: Request, pk: int) -> Response:
        stack = _stack(request, pk)
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is not None:
            services.check_idempotency_key(key)
        data = validated(s.DeploymentCreateSerializer, request)
        admin = member_role(user_of(request), stack.organization) == Role.ADMIN
        if "spec" in data and not admin:
            # The steps run with the stack's secrets in their environment: what
            # they run is the stack's (an admin's) to say, not any member's.
            raise SpecOverrideForbidden("only an org admin may queue a deployment with its own spec")
        services.check_queue_priority(data.get("priority"), admin=admin)
        deployment, replayed = services.deployment_create_once(
            stack=stack,
            spec=data.get("spec"),
            priority=data.get("priority"),
            created_by=user_of(request),
            idempotency_key=key,
        )
        headers = {"Idempotent-Replayed": "true"} if replayed else None
        return Response(s.DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED, headers=headers)


def _deployment(request: Request, pk: int) -> Deployment:
    return scoped(request, Deployment.objects.all(), pk, org_path="stack__organization")


class DeploymentDetailView(UserView):
    @extend_schema(
        operation_id="deployments_read", responses={200: s.DeploymentSerializer, **user_errors(401, 403, 404)}
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(s.DeploymentSerializer(_deployment(request, pk)).data)


class DeploymentSkipView(UserView):
    @extend_schema(
        operation_id="deployments_skip",
        request=None,
        responses={200: s.DeploymentSerializer, **user_errors(401, 403, 404, 409)},
        description="Skip a deployment whose run never started (queued, pending, assigned): the run is discarded. "
        "409 not_skippable otherwise.",
    )
    def post(self, request: Request, pk: int) -> Response:
        deployment = services.deployment_skip(deployment_id=_deployment(request, pk).id, by=user_of(request))
        return Response(s.DeploymentSerializer(deployment).data)


class DeploymentRetryView(UserView):
    @extend_schema(
        operation_id="deployments_retry",
        request=None,
        responses={200: s.DeploymentSerializer, **user_errors(401, 403, 404, 409)},
        description="A new run (attempt) of a failed, timed-out or cancelled deployment. 409 not_retryable otherwise.",
    )
    def post(self, request: Request, pk: int) -> Response:
        deployment = services.deployment_retry(deployment_id=_deployment(request, pk).id, by=user_of(request))
        return Response(s.DeploymentSerializer(deployment).data)


# ---------------------------------------------------------------- runs


def _run(request: Request, pk: uuid.UUID) -> Run:
    return scoped(request, Run.objects.prefetch_related("events"), pk, org_path="organization")


class RunDetailView(UserView):
    @extend_schema(operation_id="runs_read", responses={200: s.RunSerializer, **user_errors(401, 403, 404)})
    def get(self, request: Request, pk: uuid.UUID) -> Response:
        return Response(s.RunSerializer(_run(request, pk)).data)

    @extend_schema(
        operation_id="runs_update",
        request=s.RunUpdateSerializer,
        responses={200: s.RunSerializer, **user_errors(400, 401, 403, 404, 409)},
        description="Change a waiting run's priority (org admin; a member gets 403 `priority_forbidden`). Only a "
        "queued or pending run: 409 `run_not_waiting` once it is claimed, running or finished. The change is a "
        "`priority_changed` event in the run's history.",
    )
    def patch(self, request: Request, pk: uuid.UUID) -> Response:
        run = _run(request, pk)
        if member_role(user_of(request), run.organization) != Role.ADMIN:
            raise PriorityForbidden("only an org admin may change a run's priority")
        data = validated(s.RunUpdateSerializer, request)
        services.run_set_priority(run_id=run.id, priority=data["priority"], by=user_of(request))
        return Response(s.RunSerializer(Run.objects.prefetch_related("events").get(id=run.id)).data)


class RunCancelView(UserView):
    @extend_schema(
        operation_id="runs_cancel",
        request=None,
        responses={200: s.RunSerializer, **user_errors(401, 403, 404, 409)},
        description="RequestCancellation: a run that never started is cancelled at once; a running one moves to "
        "requested_cancellation, which its runner sees. 409 run_terminal for a finished run.",
    )
    def post(self, request: Request, pk: uuid.UUID) -> Response:
        run = services.run_request_cancellation(run_id=_run(request, pk).id, by=user_of(request))
        return Response(s.RunSerializer(Run.objects.prefetch_related("events").get(id=run.id)).data)
