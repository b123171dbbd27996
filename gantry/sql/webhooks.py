"""The webhook sender's SQL (gantry.webhooks.delivery): claim the due deliveries, record an attempt.

The outbox rows themselves are written by the transitions (gantry.sql.runs, the webhook effect).
Sent by Django's cursor, ``%(name)s`` parameters.
"""

from __future__ import annotations

# Up to %(limit)s due deliveries, each the oldest pending one of its (endpoint, run) so a run's events go
# in order; leased until %(lease)s (a sender that dies lets them fall due again), the attempt counted.
CLAIM = """
WITH due AS (
    SELECT d.id FROM webhook_delivery d
    WHERE d.status = 'pending' AND d.next_attempt_at <= %(now)s
      AND NOT EXISTS (SELECT 1 FROM webhook_delivery p
                      WHERE p.status = 'pending' AND p.endpoint_id = d.endpoint_id
                        AND p.run_id = d.run_id AND p.id < d.id)
    ORDER BY d.next_attempt_at, d.id
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_delivery w SET attempts = w.attempts + 1, next_attempt_at = %(lease)s
FROM due, webhook_endpoint e
WHERE w.id = due.id AND e.id = w.endpoint_id
RETURNING w.id, e.url, e.secret_sealed, w.event, w.body, w.delivery_id::text, w.attempts, w.created_at
"""

# One attempt's outcome.
RECORD = """
UPDATE webhook_delivery SET status = %(status)s, last_status_code = %(code)s, last_error = %(error)s,
       next_attempt_at = %(next)s, delivered_at = %(delivered)s, last_attempt_at = %(now)s
WHERE id = %(id)s
"""
