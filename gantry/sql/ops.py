"""The ops endpoints' SQL (gantry.web.ops): readiness's probe.

``/metrics``' database reads are the queue's demand counts (gantry.sql.queue).
"""

from __future__ import annotations

# Readiness: the database answers a statement on a connection of the probe's own.
READY = "SELECT 1"
