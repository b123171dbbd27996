"""Authentication's reads: a token's group (with its organization) and a runner's row (gantry.api.auth).

One indexed read per call (the primary key), prepared once per database
session, instead of the ORM's join compiled on every runner call.
"""

from __future__ import annotations

from gantry.core.models import Organization, Runner, RunnerGroup
from gantry.sql.rows import columns
from gantry.sql.statement import named

GROUP = named(
    "auth_group",
    f"SELECT {columns(RunnerGroup, 'g')}, {columns(Organization, 'o')} "
    "FROM runner_group g JOIN organization o ON o.id = g.organization_id WHERE g.id = %(group)s",
)
# The runner row only: runner views use its id, and anything reaching for
# runner.runner_group still gets it (one lazy read, off the hot path).
RUNNER = named(
    "auth_runner",
    f"SELECT {columns(Runner)} FROM runner WHERE id = %(runner)s AND runner_group_id = %(group)s",
)
