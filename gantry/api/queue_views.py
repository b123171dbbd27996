"""The queue and the runs of an org, and a runner group's demand (docs/queue.md, docs/api.md).

- ``GET /orgs/{org}/queue`` (org member): waiting runs oldest first, each with
  the reason it is not running yet (``gantry.dispatch.queue``);
- ``GET /orgs/{org}/runs`` (org member): every run, newest first, filterable;
- ``GET /runner-groups/demand`` (group JWT): what the group's own autoscaler
  reads (``gantry.dispatch.demand``).

Both lists page by an opaque ``cursor`` (the keyset of the page's last row) and
``limit``; ``next_cursor`` is null on the last page.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gantry.api.auth import IsRunnerGroup
from gantry.api.common import UserView, group_of, org_for, runner_errors, user_errors
from gantry.api.serializers import PriorityField
from gantry.core import params
from gantry.core.errors import InvalidRequest
from gantry.core.models import WAITING, Run, RunStatus
from gantry.dispatch import demand, queue

# ---------------------------------------------------------------- shapes


class QueueReasonSerializer(serializers.Serializer):
    code = serializers.ChoiceField(
        choices=[(c, c) for c in queue.CODES],
        help_text="Why the run is not running yet; the first rung of the ladder that applies (docs/queue.md).",
    )
    detail = serializers.CharField(help_text="One plain sentence; the fields below carry what it names.")
    lane_holder_run_id = serializers.UUIDField(
        required=False, allow_null=True, help_text="waiting_for_lane: the run holding the stack's lane."
    )
    runner_id = serializers.UUIDField(
        required=False, help_text="runner_booting, previous_runner_alive: the runner the run points at."
    )
    lease_expires_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="runner_booting: when the lease lapses."
    )
    reaped_after = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="previous_runner_alive: when the inactive-runner reaper may delete that runner.",
    )
    missing_labels = serializers.DictField(
        child=serializers.CharField(), required=False, help_text="no_matching_group: what the closest group lacks."
    )
    closest_group_id = serializers.IntegerField(
        required=False, allow_null=True, help_text="no_matching_group: the group missing the fewest labels."
    )
    group_ids = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="groups_drained, org_in_flight_cap, groups_at_capacity, no_runner_polling, dispatchable: "
        "the groups concerned.",
    )
    group_id = serializers.IntegerField(
        required=False, help_text="behind_higher_priority: the group where the run stands best (its position_group)."
    )
    ahead_higher = serializers.IntegerField(
        required=False, help_text="behind_higher_priority: the runs of a higher effective priority ahead of it there."
    )
    in_flight = serializers.IntegerField(
        required=False, help_text="org_in_flight_cap: the org's runs in flight on its GitHub Actions groups."
    )
    cap = serializers.IntegerField(
        required=False, help_text="org_in_flight_cap: its cap (max_in_flight, else GANTRY_DISPATCH_MAX_PER_ORG)."
    )
    until = serializers.DateTimeField(
        required=False, allow_null=True, help_text="org_throttled: the next slot (null: rate 0, never)."
    )
    last_polled_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="no_runner_polling: the latest poll of those groups."
    )


class PositionGroupSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class QueueRunSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=[(s, s) for s in sorted(WAITING)])
    priority = PriorityField(help_text="The run's own priority (its effective one rises as it waits: docs/queue.md).")
    effective_priority = PriorityField(
        help_text="Its priority as the claim ranks it now: its own, one level higher per GANTRY_PRIORITY_AGING_SECONDS "
        "pending, at most high."
    )
    position = serializers.IntegerField(
        allow_null=True,
        help_text="1-based place in the claim's order of position_group, among every claimable run that group "
        "serves (any stack). Null when the run is not claimable now (queued, assigned, or held for a previous "
        "runner), no undrained group can take it, or it is past the 10,000th.",
    )
    position_group = PositionGroupSerializer(
        allow_null=True, help_text="The group where the run stands best (lowest position); null with position."
    )
    expected_start_seconds = serializers.IntegerField(
        allow_null=True,
        help_text="Estimated seconds until it starts, from its groups' hand-outs over the last "
        "GANTRY_QUEUE_RATE_WINDOW seconds and their free slots (docs/queue.md). Null when no group handed out a "
        "run in that window (no basis) or the run has no position.",
    )
    stack_id = serializers.IntegerField()
    stack_name = serializers.CharField()
    deployment_id = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    waiting_seconds = serializers.IntegerField(help_text="Whole seconds since the run was created.")
    reason = QueueReasonSerializer()


class QueuePageSerializer(serializers.Serializer):
    runs = QueueRunSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Pass as ?cursor= for the next page.")


class RunSummarySerializer(serializers.ModelSerializer):
    priority = PriorityField(read_only=True)
    stack_id = serializers.IntegerField()
    stack_name = serializers.CharField(source="stack.name")
    deployment_id = serializers.IntegerField()

    class Meta:
        model = Run
        fields = ["id", "status", "priority", "stack_id", "stack_name", "deployment_id", "attempt", "created_at",
                  "first_pending_at", "started_at", "finished_at", "exit_code", "failure_reason"]  # fmt: skip
        read_only_fields = fields


class RunPageSerializer(serializers.Serializer):
    runs = RunSummarySerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Pass as ?cursor= for the next page.")


class DemandSerializer(serializers.Serializer):
    runnable = serializers.IntegerField(
        help_text="Pending runs this group could take now if it had free slots: their selector matches, the org "
        "is not throttled and the group is not drained (0 when it is)."
    )
    running = serializers.IntegerField(help_text="Runs assigned to or executing on this group's runners.")
    max_concurrent_runs = serializers.IntegerField()


_PAGING = [
    OpenApiParameter("cursor", str, description="next_cursor of the previous page."),
    OpenApiParameter("limit", int, description=f"Runs per page, 1-{queue.PAGE_MAX} (default {queue.PAGE_DEFAULT})."),
]


# ---------------------------------------------------------------- views


def queue_entry(entry: queue.QueueEntry) -> dict[str, Any]:
    run = entry.run
    return {
        "id": run.id,
        "status": run.status,
        "priority": run.priority,
        "effective_priority": entry.effective_priority,
        "position": entry.position,
        "position_group": (
            {"id": entry.position_group_id, "name": entry.position_group_name}
            if entry.position_group_id is not None
            else None
        ),
        "expected_start_seconds": entry.expected_start_seconds,
        "stack_id": run.stack_id,
        "stack_name": run.stack_name,
        "deployment_id": run.deployment_id,
        "created_at": run.created_at,
        "waiting_seconds": entry.waiting_seconds,
        "reason": entry.reason,
    }


class QueueView(UserView):
    @extend_schema(
        operation_id="orgs_queue",
        parameters=_PAGING,
        responses={200: QueuePageSerializer, **user_errors(400, 401, 403, 404)},
        description="Every queued, pending and assigned run of the org, oldest first, each with the reason it is "
        "not running yet, its place in the claim's order and its expected start (org member). The codes are a "
        "closed set, decided in ladder order (docs/queue.md).",
    )
    def get(self, request: Request, org: str) -> Response:
        organization = org_for(request, org)
        page = queue.read_queue(
            org=organization,
            now=timezone.now(),
            cursor=request.query_params.get("cursor"),
            limit=queue.page_limit(request.query_params.get("limit")),
        )
        body = {"runs": [queue_entry(e) for e in page.entries], "next_cursor": page.next_cursor}
        return Response(QueuePageSerializer(body).data)


def _int_param(request: Request, name: str) -> int | None:
    """An id filter: absent or empty is no filter; else 1-19 ASCII digits up to a bigint (400 otherwise)."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    return params.whole_number(raw, name=name)


def runs_page(request: Request, org_id: int) -> tuple[list[Run], str | None]:
    """The org's runs newest first, filtered and keyset-paginated by (created_at, id)."""
    qs = Run.objects.filter(organization_id=org_id).select_related("stack")
    status = request.query_params.get("status")
    if status:
        if status not in RunStatus.values:
            raise InvalidRequest(f"status must be one of: {', '.join(RunStatus.values)}", field="status")
        qs = qs.filter(status=status)
    for name in ("stack_id", "deployment_id"):
        value = _int_param(request, name)
        if value is not None:
            qs = qs.filter(**{name: value})
    after = queue.decode_cursor(request.query_params.get("cursor"))
    if after is not None:
        at, run_id = after
        # created_at <= at bounds the index range; the OR breaks ties inside one instant.
        qs = qs.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=run_id), created_at__lte=at)
    limit = queue.page_limit(request.query_params.get("limit"))
    runs = list(qs.order_by("-created_at", "-id")[:limit])
    last = runs[-1] if len(runs) == limit else None
    return runs, queue.encode_cursor(last.created_at, last.id) if last else None


class RunListView(UserView):
    @extend_schema(
        operation_id="orgs_runs_list",
        parameters=[
            OpenApiParameter("status", str, enum=RunStatus.values, description="Only runs in this status."),
            OpenApiParameter("stack_id", int, description="Only runs of this stack."),
            OpenApiParameter("deployment_id", int, description="Only runs (attempts) of this deployment."),
            *_PAGING,
        ],
        responses={200: RunPageSerializer, **user_errors(400, 401, 403, 404)},
        description="Every run of the org, newest first (org member).",
    )
    def get(self, request: Request, org: str) -> Response:
        organization = org_for(request, org)
        runs, next_cursor = runs_page(request, organization.id)
        return Response({"runs": RunSummarySerializer(runs, many=True).data, "next_cursor": next_cursor})


class DemandView(APIView):
    permission_classes = [IsRunnerGroup]

    @extend_schema(
        operation_id="runner_groups_demand",
        responses={200: DemandSerializer, **runner_errors(401, 403)},
        description="The calling group's demand, for its autoscaler (KEDA's metrics-api scaler, an HPA through "
        "an external-metrics adapter): runnable, running, max_concurrent_runs. See docs/queue.md.",
    )
    def get(self, request: Request) -> Response:
        group = group_of(request).group
        found = demand.group_demand(group_id=group.id, now=timezone.now())
        return Response(DemandSerializer(found).data)
