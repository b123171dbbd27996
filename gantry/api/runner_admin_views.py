"""Runners, as users and org admins see them: a group's runners, and force-delete.

Same scoping as the rest of the user API (``common.scoped``): another org's
group or runner answers 404, a member asking for an admin's action 403.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from gantry.api.common import UserView, error_responses, scoped
from gantry.core.models import TERMINAL, Run, Runner, RunnerGroup
from gantry.reapers import reapers

_ADMIN_ERRORS = {
    401: "no or invalid credentials",
    403: "not a user token, or not an admin of the runner's organization",
    404: "not found (or not yours)",
    409: "runner_not_offline: the runner has not been offline for GANTRY_RUNNER_FORCE_GATE yet",
}


def _errors(*codes: int) -> dict[int, Any]:
    return error_responses(*codes, texts=_ADMIN_ERRORS)


class RunnerSerializer(serializers.ModelSerializer):
    run_id = serializers.UUIDField(
        allow_null=True,
        read_only=True,
        help_text="The run this runner is bound to and that has not finished, derived from the run's "
        "assigned runner (a runner row carries no pointer of its own); null when there is none.",
    )

    class Meta:
        model = Runner
        # workflow_*: a github_actions runner's workflow run (its id and its page on GitHub).
        fields = ["id", "status", "created_at", "ready_at", "accepted_at", "last_seen_at", "hostname", "launcher",
                  "pid", "run_id", "workflow_run_id", "workflow_run_url", "dispatched_at"]  # fmt: skip
        read_only_fields = fields


def runners_with_run(group: RunnerGroup) -> QuerySet[Runner]:
    # The binding lives only in run.assigned_runner_id (indexed); a terminal
    # run keeps the pointer, so it is filtered out here.
    bound = Run.objects.filter(assigned_runner_id=OuterRef("id")).exclude(status__in=sorted(TERMINAL)).values("id")
    return Runner.objects.filter(runner_group=group).annotate(run_id=Subquery(bound[:1])).order_by("created_at", "id")


class RunnerGroupRunnersView(UserView):
    @extend_schema(
        operation_id="runner_groups_runners_list",
        responses={200: RunnerSerializer(many=True), **_errors(401, 403, 404)},
        description="The group's runners (its occupied slots), oldest first (org member).",
    )
    def get(self, request: Request, pk: int) -> Response:
        group = scoped(request, RunnerGroup.objects.all(), pk, org_path="organization")
        return Response(RunnerSerializer(runners_with_run(group), many=True).data)


class RunnerForceDeleteView(UserView):
    @extend_schema(
        operation_id="runners_force_delete",
        request=None,
        responses={204: None, **_errors(401, 403, 404, 409)},
        description="Delete a runner that has been offline (last status poll, or creation when it never polled) "
        "for at least GANTRY_RUNNER_FORCE_GATE (org admin). The run it was executing fails at once (event "
        "force_deleted), its stack's queue moves on, and its live log is flushed; a run it was only assigned "
        "is released for dispatch. Before the gate: 409 runner_not_offline, with eligible_at.",
    )
    def post(self, request: Request, runner_id: uuid.UUID) -> Response:
        runner = scoped(request, Runner.objects.all(), runner_id, org_path="runner_group__organization", admin=True)
        assert isinstance(request.user, User)  # UserView admits users only
        reapers.force_delete_runner(runner_id=runner.id, by=request.user, now=timezone.now())
        return Response(status=status.HTTP_204_NO_CONTENT)
