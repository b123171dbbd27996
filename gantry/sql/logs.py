"""The logs app's SQL (gantry.logs): who may push a run's live log, and what a flush reads and records."""

from __future__ import annotations

from gantry.core.models import EXECUTING, TERMINAL
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

# ---------------------------------------------------------------- the flush (gantry.logs.services.PendingFlush)
#
# Not hot (a reaper's batch, a force-delete): sent by Django's cursor, ``%s``
# parameters.

# What a flush needs to know of each run (%s: the ids): its status, whether
# storage is authoritative already (a manifest), whether it ever started.
FLUSH_STATE = "SELECT id, status, log_manifest IS NOT NULL, started_at IS NOT NULL FROM run WHERE id = ANY(%s::uuid[])"

# The manifest is written only where none is (guarded), for many runs at once.
RECORD_MANIFESTS = """
UPDATE run SET log_manifest = v.manifest
FROM unnest(%s::uuid[], %s::jsonb[]) AS v(id, manifest)
WHERE run.id = v.id AND run.log_manifest IS NULL
RETURNING run.id
"""

# The same, also releasing finished runs from the runners about to be deleted
# (``finish(release=…)``): one row version per run instead of two (the
# manifest, then the foreign key's SET NULL when the runner row goes; run
# has a dozen indexes and neither update can be HOT).
_RELEASABLE = f"(v.runner IS NOT NULL AND run.assigned_runner_id = v.runner AND run.status IN ({literals(TERMINAL)}))"
RECORD_AND_RELEASE = f"""
UPDATE run SET log_manifest = COALESCE(run.log_manifest, v.manifest),
               assigned_runner_id = CASE WHEN {_RELEASABLE} THEN NULL ELSE run.assigned_runner_id END
FROM unnest(%s::uuid[], %s::jsonb[], %s::uuid[]) AS v(id, manifest, runner)
WHERE run.id = v.id AND ((run.log_manifest IS NULL AND v.manifest IS NOT NULL) OR {_RELEASABLE})
RETURNING run.id, v.manifest IS NOT NULL AND run.log_manifest = v.manifest
"""

# The run's first push with output (once per run: gantry.logs.services._store_live). The run's own
# clock, as its other timestamps; a guarded UPDATE, so a replay changes nothing.
STAMP_FIRST_OUTPUT = "UPDATE run SET first_output_at = now() WHERE id = %(run)s AND first_output_at IS NULL"
