"""Sending the outbox: what is due, signed, in order per run, retried with backoff for a day.

A sender *claims* due rows first (one statement: attempts + 1, and
``next_attempt_at`` pushed out by :data:`LEASE`, so no other sender takes
them), commits, sends without holding a transaction, then records the answer.
A sender that dies mid-way leaves its rows to come due again when the lease
lapses: at least once, never lost. A row is due only when no earlier row of
the same run to the same endpoint is still pending, so a run's events reach a
receiver in order (an earlier one that gave up, ``failed``, no longer holds
the later ones back).

A 2xx answer is delivered; anything else (another status, a timeout, a refused
address) is retried after :func:`backoff`, until the row is a day old: then it
is ``failed``.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import logging
import socket
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from gantry.core.errors import GantryError
from gantry.core.models import DeliveryStatus
from gantry.core.secrets import SecretUnreadable
from gantry.sql import webhooks as sql
from gantry.webhooks import addresses
from gantry.webhooks.services import endpoint_secret

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Gantry-Signature-256"
EVENT_HEADER = "X-Gantry-Event"
DELIVERY_HEADER = "X-Gantry-Delivery"
# A receiver answers quickly (it queues the work); a slow one is retried, not waited for.
TIMEOUT = 5.0
# How long a claimed row is the claimer's: well over one batch's sending (BATCH / PARALLEL sends of TIMEOUT).
LEASE = timedelta(minutes=2)
BATCH = 20
PARALLEL = 8
# Rounds of one deliver_due call: a batch claims at most one row per (run, endpoint), the next round the next.
ROUNDS = 50
GIVE_UP_AFTER = timedelta(days=1)
# What of a receiver's answer is kept for the page: its status and the start of an error.
ERROR_MAX = 500


def signature(secret: str, body: bytes) -> str:
    """The ``X-Gantry-Signature-256`` value: ``sha256=`` and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def backoff(attempts: int) -> timedelta:
    """How long after its ``attempts``-th failed attempt a delivery is tried again: 15 s, doubling, at most 1 h."""
    return timedelta(seconds=min(15 * 2 ** max(attempts - 1, 0), 3600))


@dataclass(frozen=True)
class Claimed:
    id: int
    url: str
    secret_sealed: str
    event: str
    body: str
    delivery_id: str
    attempts: int
    created_at: datetime


def claim(now: datetime, limit: int = BATCH) -> list[Claimed]:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.CLAIM, {"now": now, "limit": limit, "lease": now + LEASE})
        return [Claimed(*row) for row in cur.fetchall()]


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = TIMEOUT) -> int:
    """POST ``body`` to ``url`` at the address :func:`addresses.resolve` judged; the answer's status.

    No redirect is followed (a 3xx is an answer like any non-2xx: it could
    point anywhere). Raises OSError / HTTPException on a network failure and
    GantryError for a refused URL.
    """
    parts, address = addresses.resolve(url)
    host = parts.hostname or ""
    port = parts.port or addresses.SCHEMES[parts.scheme]
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(host, port, timeout=timeout)

    # Connect to the judged address; the host name still goes in Host and, for https, in SNI and the
    # certificate check (http.client uses self.host for both).
    def pinned(_: Any, timeout: Any = None, source_address: Any = None) -> socket.socket:
        return socket.create_connection((address, port), timeout, source_address)

    conn._create_connection = pinned  # type: ignore[attr-defined]
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(65536)
        return response.status
    finally:
        conn.close()


def send(row: Claimed) -> tuple[int | None, str]:
    """One attempt of ``row``: (the receiver's status, or None; an error for the record, empty when none)."""
    body = row.body.encode("utf-8")
    try:
        secret = endpoint_secret(row.secret_sealed)
    except SecretUnreadable as exc:
        return None, str(exc)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Gantry-Webhook/1",
        SIGNATURE_HEADER: signature(secret, body),
        EVENT_HEADER: row.event,
        DELIVERY_HEADER: row.delivery_id,
    }
    try:
        code = post(row.url, body, headers)
    except GantryError as exc:
        return None, exc.detail
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:ERROR_MAX]
    return code, "" if 200 <= code < 300 else f"answered {code}"


def record(row: Claimed, code: int | None, error: str, now: datetime) -> str:
    """Write ``row``'s attempt down; its new status."""
    nxt = now + backoff(row.attempts)
    if code is not None and 200 <= code < 300:
        status, delivered = DeliveryStatus.DELIVERED, now
    elif nxt - row.created_at > GIVE_UP_AFTER:
        status, delivered = DeliveryStatus.FAILED, None
    else:
        status, delivered = DeliveryStatus.PENDING, None
    with connection.cursor() as cur:
        cur.execute(
            sql.RECORD,
            {
                "status": status,
                "code": code,
                "error": error,
                "next": nxt,
                "delivered": delivered,
                "now": now,
                "id": row.id,
            },
        )
    if status != DeliveryStatus.DELIVERED:
        log.warning(
            "webhook delivery %s (%s) attempt %d: %s%s",
            row.delivery_id,
            row.event,
            row.attempts,
            error,
            "; gave up" if status == DeliveryStatus.FAILED else "",
        )
    return str(status)


def deliver_due(rounds: int = ROUNDS) -> dict[str, int]:
    """Send what is due now, round after round until nothing is (or ``rounds``); counts by outcome.

    Each round claims a batch and sends it in parallel (different runs or
    endpoints: a batch holds at most one row of a run for an endpoint).
    """
    counts: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="webhook") as pool:
        for _ in range(rounds):
            rows = claim(timezone.now())
            if not rows:
                break
            answers = list(pool.map(send, rows))
            now = timezone.now()
            for row, (code, error) in zip(rows, answers, strict=True):
                counts[record(row, code, error, now)] += 1
    return dict(counts)
