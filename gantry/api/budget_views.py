"""``GET /orgs/{org}/dispatch-budget``: the org's runs/hour budget as it stands (docs/throttle.md).

Read by org members (the queue page's banner): whether the org is throttled
and when its next run may dispatch. It only peeks at the bucket; reading the
budget never spends or refills anything.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from gantry.api.common import UserView, error_responses, org_for
from gantry.dispatch import throttle


class DispatchBudgetSerializer(serializers.Serializer):
    runs_per_hour_limit = serializers.IntegerField(help_text="Refill rate: runs per hour.")
    burst = serializers.IntegerField(help_text="Bucket size: runs_per_hour_limit * 24. 0 when the rate is 0.")
    tokens_available = serializers.IntegerField(
        allow_null=True,
        help_text="Whole runs that may dispatch right now (fractions of a token are left out). "
        "null when the bucket cannot be read (Redis unavailable) or rate limiting is off.",
    )
    throttled = serializers.BooleanField(help_text="True when not one run may dispatch right now.")
    next_slot_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When the next run may dispatch; null when one may now, or never will (rate 0).",
    )
    seconds_to_next_slot = serializers.IntegerField(
        allow_null=True,
        help_text="Whole seconds until next_slot_at (rounded up); 0 when a run may dispatch now; "
        "null when none ever will (rate 0).",
    )
    dispatch_throttled_until = serializers.DateTimeField(
        allow_null=True,
        help_text="The deferral stamp the last throttled claim wrote (a scheduling hint; a rate change clears it).",
    )
    answered_from = serializers.ChoiceField(
        choices=["bucket", "stamp", "disabled"],
        help_text="bucket: read from the token bucket. stamp: Redis unavailable, so throttled and the next slot "
        "come from dispatch_throttled_until (dispatch meanwhile fails open). disabled: rate limiting is off "
        "on this instance; nothing is throttled.",
    )


class DispatchBudgetView(UserView):
    @extend_schema(
        operation_id="orgs_dispatch_budget",
        responses={200: DispatchBudgetSerializer, **error_responses(401, 403, 404)},
        description="The org's dispatch budget (org member): rate, burst, runs that may dispatch now, whether the "
        "org is throttled and when its next run may go. Reading it consumes nothing.",
    )
    def get(self, request: Request, org: str) -> Response:
        organization = org_for(request, org)
        budget = throttle.budget(
            organization_id=organization.id,
            rate=organization.runs_per_hour_limit,
            stamp=organization.dispatch_throttled_until,
            now=timezone.now(),
        )
        return Response(DispatchBudgetSerializer(budget).data)
