"""NOTIFY parked long polls whenever a run becomes claimable or a slot frees up.

Triggers rather than calls in the code, so that no path can forget: a run
created pending, promoted, returned to pending by a lapsed lease, or released
by its runner row going away (the ON DELETE SET NULL action is an UPDATE and
fires these too) — and a runner row deleted (its group has a free slot again).
The payload is the org id; parked polls of that org retry their claim.
NOTIFY is delivered on commit and deduplicated within a transaction, so a
set-based reaper sweep sends one message per org, not one per row.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION run_notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gantry_claimable', NEW.organization_id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER run_claimable_on_insert
    AFTER INSERT ON run FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.assigned_runner_id IS NULL)
    EXECUTE FUNCTION run_notify_claimable();

CREATE TRIGGER run_claimable_on_update
    AFTER UPDATE OF status, assigned_runner_id ON run FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.assigned_runner_id IS NULL
          AND (OLD.status <> 'pending' OR OLD.assigned_runner_id IS NOT NULL))
    EXECUTE FUNCTION run_notify_claimable();

CREATE OR REPLACE FUNCTION runner_group_count_runners() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    org bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE runner_group SET runner_count = runner_count - 1 WHERE id = OLD.runner_group_id
            RETURNING organization_id INTO org;
        -- A slot is free again: polls parked on a full group may claim now.
        IF org IS NOT NULL THEN
            PERFORM pg_notify('gantry_claimable', org::text);
        END IF;
    ELSIF NEW.runner_group_id IS DISTINCT FROM OLD.runner_group_id THEN
        UPDATE runner_group SET runner_count = runner_count - 1 WHERE id = OLD.runner_group_id;
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    END IF;
    RETURN NULL;
END $$;
"""

REVERSE = """
DROP TRIGGER run_claimable_on_insert ON run;
DROP TRIGGER run_claimable_on_update ON run;
DROP FUNCTION run_notify_claimable();
CREATE OR REPLACE FUNCTION runner_group_count_runners() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE runner_group SET runner_count = runner_count - 1 WHERE id = OLD.runner_group_id;
    ELSIF NEW.runner_group_id IS DISTINCT FROM OLD.runner_group_id THEN
        UPDATE runner_group SET runner_count = runner_count - 1 WHERE id = OLD.runner_group_id;
        UPDATE runner_group SET runner_count = runner_count + 1 WHERE id = NEW.runner_group_id;
    END IF;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("core", "0003_claim_index_and_runner_count")]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=REVERSE)]
