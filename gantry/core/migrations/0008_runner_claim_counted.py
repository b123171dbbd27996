"""The claim counts its own stub runner; the insert trigger counts every other runner row.

Before, each won claim wrote its group's row twice: the claim statement's
``last_polled_at`` stamp, then the ``runner_count`` trigger for the stub. Now
the statement locks the group row, and writes it once at the end, stamp and
count together; the stub is inserted with ``claim_counted`` so the insert
trigger (a plpgsql call and a second row version of the hottest row in the
schema) skips it. Deletes and group moves are counted by the trigger as
before, and so is any insert that does not set the flag: the ORM's, raw SQL,
the tests'. docs/performance.md measured 1–7% more claims per second.

Adding a column with a constant default is a catalog change (no table
rewrite). The count itself does not change: rows that exist were counted by
the old trigger.
"""

from django.db import migrations, models

FORWARD = """
DROP TRIGGER runner_count_runners ON runner;
CREATE TRIGGER runner_count_on_insert
    AFTER INSERT ON runner FOR EACH ROW
    WHEN (NOT NEW.claim_counted)
    EXECUTE FUNCTION runner_group_count_runners();
CREATE TRIGGER runner_count_on_change
    AFTER DELETE OR UPDATE OF runner_group_id ON runner FOR EACH ROW
    EXECUTE FUNCTION runner_group_count_runners();
"""

REVERSE = """
DROP TRIGGER runner_count_on_insert ON runner;
DROP TRIGGER runner_count_on_change ON runner;
CREATE TRIGGER runner_count_runners
    AFTER INSERT OR DELETE OR UPDATE OF runner_group_id ON runner FOR EACH ROW
    EXECUTE FUNCTION runner_group_count_runners();
"""


class Migration(migrations.Migration):
    dependencies = [("core", "0007_drop_redundant_indexes")]

    operations = [
        migrations.AddField(
            model_name="runner",
            name="claim_counted",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.RunSQL(sql=FORWARD, reverse_sql=REVERSE),
    ]
