"""Registering, listing and deleting an org's webhook endpoints: the rules the API and the page share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User

from gantry.core import secrets
from gantry.core.errors import InvalidRequest
from gantry.core.models import WEBHOOK_EVENTS, Organization, WebhookDelivery, WebhookEndpoint
from gantry.webhooks import addresses

URL_MAX = 2000
SECRET_MIN, SECRET_MAX = 16, 256
# Deliveries an endpoint's listing shows, newest first.
RECENT = 20


def clean_events(events: Any) -> list[str]:
    """``events`` as a list of known event names, in WEBHOOK_EVENTS' order; InvalidRequest otherwise."""
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise InvalidRequest("events must be a non-empty list of event names", allowed=list(WEBHOOK_EVENTS))
    unknown = sorted(set(events) - set(WEBHOOK_EVENTS))
    if unknown:
        raise InvalidRequest(f"unknown events: {', '.join(unknown)}", allowed=list(WEBHOOK_EVENTS))
    return [e for e in WEBHOOK_EVENTS if e in events]


def clean_secret(secret: Any) -> str:
    if not isinstance(secret, str) or not (SECRET_MIN <= len(secret) <= SECRET_MAX) or secret.strip() != secret:
        raise InvalidRequest(
            f"secret must be a string of {SECRET_MIN} to {SECRET_MAX} characters without surrounding spaces"
        )
    return secret


def clean_url(url: Any) -> str:
    if not isinstance(url, str) or not url or len(url) > URL_MAX:
        raise InvalidRequest(f"url must be a string of at most {URL_MAX} characters")
    addresses.resolve(url)  # malformed, unresolvable or refused: 400, nothing stored
    return url


def endpoint_create(
    *, org: Organization, url: Any, events: Any, secret: Any, user: User | None = None
) -> WebhookEndpoint:
    """A new endpoint of ``org`` (every field checked first: a refusal stores nothing); the secret sealed at rest."""
    names, plain, target = clean_events(events), clean_secret(secret), clean_url(url)
    sealed = secrets.seal({"secret": plain})["secret"]
    return WebhookEndpoint.objects.create(
        organization=org, url=target, events=names, secret_sealed=sealed, created_by=user
    )


def endpoint_delete(endpoint: WebhookEndpoint) -> None:
    """Delete ``endpoint`` and its deliveries, sent or not (nothing more goes to it)."""
    endpoint.delete()


def endpoint_secret(sealed: str) -> str:
    """The secret a delivery is signed with (SecretUnreadable when no configured key opens it)."""
    return secrets.unseal({"secret": sealed})["secret"]


def recent_deliveries(endpoints: Sequence[WebhookEndpoint], limit: int = RECENT) -> dict[int, list[WebhookDelivery]]:
    """Each endpoint's newest ``limit`` deliveries, by endpoint id (one index range per endpoint)."""
    return {e.pk: list(WebhookDelivery.objects.filter(endpoint=e).order_by("-id")[:limit]) for e in endpoints}
