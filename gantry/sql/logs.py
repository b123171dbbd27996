"""The logs app's SQL (gantry.logs): who may push a run's live log, and the manifests a flush records."""

from __future__ import annotations

from gantry.core.models import EXECUTING
from gantry.sql import literals
from gantry.sql.statement import named

# A live push comes every few seconds from every running runner: its check is
# one prepared EXECUTE, not an ORM query compiled per push. The runner (of the
# token's group, when ``grp`` is given) is executing the run.
HELD = named(
    "log_held",
    f"SELECT EXISTS (SELECT 1 FROM run WHERE id = %(run)s AND assigned_runner_id = %(runner)s "
    f"AND status IN ({literals(EXECUTING)}) AND (%(grp)s::bigint IS NULL"
    " OR EXISTS (SELECT 1 FROM runner g WHERE g.id = %(runner)s AND g.runner_group_id = %(grp)s)))",
)
