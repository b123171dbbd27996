"""A connection's session settings, for connections Django does not set up itself (gantry.server.lanedb)."""

from __future__ import annotations

from psycopg import sql


def set_time_zone(zone: str) -> sql.Composed:
    """``SET TIME ZONE`` to ``zone``, quoted as a literal."""
    return sql.SQL("SET TIME ZONE {}").format(sql.Literal(zone))
