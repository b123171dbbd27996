"""An org's webhook endpoints (docs/webhooks.md): register, list, delete, and each one's recent deliveries.

Every route is for org admins only, reading included: an endpoint's URL can
carry a receiver's own token in its path or query, and its deliveries show
what the receiver answered, which members have no need to see.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from gantry.api.common import UserView, org_for, scoped, user_errors, user_of
from gantry.core.errors import InvalidRequest
from gantry.core.models import WEBHOOK_EVENTS, DeliveryStatus, WebhookDelivery, WebhookEndpoint
from gantry.webhooks import services


class WebhookCreateSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="Where deliveries are POSTed: an http(s) URL resolving to public addresses.")
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=list(WEBHOOK_EVENTS)), help_text="The events to deliver (at least one)."
    )
    secret = serializers.CharField(
        write_only=True,
        trim_whitespace=False,
        help_text=f"Signs every delivery (X-Gantry-Signature-256); {services.SECRET_MIN}-{services.SECRET_MAX} "
        "characters; never answered.",
    )


class WebhookSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "events", "created_at"]


class WebhookDeliverySerializer(serializers.ModelSerializer):
    # A finished row's stored next_attempt_at is a backoff that never comes (retention's clock): not shown.
    next_attempt_at = serializers.SerializerMethodField(
        help_text="When the next attempt is due while pending; null once delivered or failed."
    )

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_attempt_at(self, delivery: WebhookDelivery) -> str | None:
        if delivery.status != DeliveryStatus.PENDING:
            return None
        return serializers.DateTimeField().to_representation(delivery.next_attempt_at)

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "delivery_id",
            "event",
            "run_id",
            "status",
            "attempts",
            "next_attempt_at",
            "last_status_code",
            "last_error",
            "created_at",
            "delivered_at",
            "last_attempt_at",
        ]
        extra_kwargs = {
            "last_attempt_at": {"help_text": "When the last attempt ended (for a failed delivery, when it gave up)."},
        }


def _endpoint(request: Request, pk: int) -> WebhookEndpoint:
    return scoped(request, WebhookEndpoint.objects.all(), pk, org_path="organization", admin=True)


class WebhookListView(UserView):
    @extend_schema(
        operation_id="webhooks_list",
        responses={200: WebhookSerializer(many=True), **user_errors(401, 403, 404)},
        description="The org's webhook endpoints, without their secrets (org admin).",
    )
    def get(self, request: Request, org: str) -> Response:
        organization = org_for(request, org, admin=True)
        return Response(WebhookSerializer(organization.webhooks.all(), many=True).data)

    @extend_schema(
        operation_id="webhooks_create",
        request=WebhookCreateSerializer,
        responses={201: WebhookSerializer, **user_errors(400, 401, 403, 404)},
        description="Register an endpoint (org admin). 400 `webhook_url_forbidden` for a URL resolving to a "
        "private, loopback or link-local address; any refusal stores nothing.",
    )
    def post(self, request: Request, org: str) -> Response:
        organization = org_for(request, org, admin=True)
        data: Any = request.data
        if not isinstance(data, dict):
            raise InvalidRequest("the request body must be a JSON object")
        # The services judge every field (the page calls them too); the serializer above documents the body.
        endpoint = services.endpoint_create(
            org=organization,
            url=data.get("url"),
            events=data.get("events"),
            secret=data.get("secret"),
            user=user_of(request),
        )
        return Response(WebhookSerializer(endpoint).data, status=status.HTTP_201_CREATED)


class WebhookDetailView(UserView):
    @extend_schema(operation_id="webhooks_read", responses={200: WebhookSerializer, **user_errors(401, 403, 404)})
    def get(self, request: Request, pk: int) -> Response:
        return Response(WebhookSerializer(_endpoint(request, pk)).data)

    @extend_schema(
        operation_id="webhooks_delete",
        request=None,
        responses={204: None, **user_errors(401, 403, 404)},
        description="Delete the endpoint and its deliveries (org admin); nothing more is sent to it.",
    )
    def delete(self, request: Request, pk: int) -> Response:
        services.endpoint_delete(_endpoint(request, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookDeliveryListView(UserView):
    @extend_schema(
        operation_id="webhooks_deliveries",
        responses={200: WebhookDeliverySerializer(many=True), **user_errors(401, 403, 404)},
        description=f"The endpoint's newest {services.RECENT} deliveries, newest first (org admin).",
    )
    def get(self, request: Request, pk: int) -> Response:
        endpoint = _endpoint(request, pk)
        rows = services.recent_deliveries([endpoint])[endpoint.pk]
        return Response(WebhookDeliverySerializer(rows, many=True).data)
