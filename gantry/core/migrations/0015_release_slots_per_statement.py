"""Deleted runners free their slots once per statement and group, and NOTIFY only where that can start a run.

Before, a per-row trigger decremented ``runner_group.runner_count`` for every
deleted runner and sent ``gantry_claimable`` each time:

- A reaper batch deleting a thousand lost runners of one group wrote that
  group's row a thousand times (the hottest row in the schema, which every
  claim of the group locks), a plpgsql call each: most of the 10,000-lost-
  runners tick (docs/performance.md, "Set-based reapers").
- Every deregister woke the long-poll listeners of every server process, and
  the leader, with nobody parked, forwarded it to the others: a transaction
  and four wake-ups per finished run for a message nobody needed. A freed
  slot only matters to a poll parked on a group that was full (a poll of a
  group with room parks for want of runs, which a deletion does not change),
  and to the backend dispatcher, whose per-org cap counts github_actions
  runner rows whatever their group's room.

Now a statement-level trigger reads the deleted rows (a transition table),
writes each group once with its count, and notifies the org only for a group
that was full before the statement or is a github_actions group. A run the
deletion releases (the FK's ON DELETE SET NULL) still notifies through the
run triggers of migration 0004, as before. Inserts and group moves keep the
per-row trigger (one row each; the claim counts its own stub).
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION runner_group_count_runners() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    ELSIF TG_OP = 'UPDATE' AND NEW.runner_group_id IS DISTINCT FROM OLD.runner_group_id THEN
        UPDATE runner_group SET runner_count = runner_count - 1 WHERE id = OLD.runner_group_id;
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION runner_group_release_slots() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    org bigint;
    notify boolean;
BEGIN
    FOR org, notify IN
        UPDATE runner_group g SET runner_count = g.runner_count - gone_here.n
        FROM (SELECT runner_group_id, count(*) AS n FROM gone GROUP BY runner_group_id) gone_here
        WHERE g.id = gone_here.runner_group_id
        -- runner_count is the new value here: the group was full when new + n >= max.
        RETURNING g.organization_id,
                  g.runner_count + gone_here.n >= g.max_concurrent_runs OR g.kind = 'github_actions'
    LOOP
        IF notify THEN
            PERFORM pg_notify('gantry_claimable', org::text);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

DROP TRIGGER runner_count_on_change ON runner;
CREATE TRIGGER runner_count_on_move
    AFTER UPDATE OF runner_group_id ON runner FOR EACH ROW
    EXECUTE FUNCTION runner_group_count_runners();
CREATE TRIGGER runner_count_on_delete
    AFTER DELETE ON runner REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION runner_group_release_slots();
"""

# Back to migration 0004's function and 0008's triggers.
REVERSE = """
DROP TRIGGER runner_count_on_delete ON runner;
DROP TRIGGER runner_count_on_move ON runner;
DROP FUNCTION runner_group_release_slots();
CREATE OR REPLACE FUNCTION runner_group_count_runners() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    org bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE runner_group SET runner_count = runner_count - 1 WHERE id = OLD.runner_group_id
            RETURNING organization_id INTO org;
        IF org IS NOT NULL THEN
            PERFORM pg_notify('gantry_claimable', org::text);
        END IF;
    ELSIF NEW.runner_group_id IS DISTINCT FROM OLD.runner_group_id THEN
        UPDATE runner_group SET runner_count = runner_count - 1 WHERE id = OLD.runner_group_id;
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER runner_count_on_change
    AFTER DELETE OR UPDATE OF runner_group_id ON runner FOR EACH ROW
    EXECUTE FUNCTION runner_group_count_runners();
"""


class Migration(migrations.Migration):
    dependencies = [("core", "0014_retention")]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=REVERSE)]
