"""Migrations keep release N working on release N+1's schema (docs/operations.md, "Upgrades").

An upgrade migrates first and then replaces the replicas one by one, so for a
while the previous release's code serves on the new schema. Every migration of
Gantry's apps is read from disk (no database) and its schema operations are
checked against the expand/contract rules:

- a new column is nullable or has a database default (``db_default``): the old
  code's inserts do not name it;
- no column is made NOT NULL or changes type in place;
- nothing is removed or renamed, and no UNIQUE or CHECK constraint is added to
  a table that already exists, except in a migration that declares itself the
  contract step of an earlier expand, with a class attribute
  ``contract = "<what the previous release stopped using, and when>"``.

``RunSQL`` and ``RunPython`` are not judged here: their review is by hand
(docs/operations.md says what they must keep).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import migrations, models
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.migration import Migration
from django.db.migrations.state import ProjectState

# Migrations written before these rules, each with why it is allowed to stand. New ones never join.
GRANDFATHERED: dict[tuple[str, str], str] = {
    # Case-insensitive unique names: its RunPython renamed the duplicates first; before the upgrade rules.
    ("core", "0012_names_ci_unique"): "unique constraints on existing tables, before the upgrade rules",
}
_REMOVALS = (
    migrations.RemoveField,
    migrations.DeleteModel,
    migrations.RenameField,
    migrations.RenameModel,
)


@dataclass(frozen=True)
class Violation:
    migration: str
    operation: str
    why: str


def narrows(old: models.BaseConstraint | None, new: models.BaseConstraint) -> bool:
    """``new`` is ``old`` (an unconditional UNIQUE this migration dropped) made partial: the same columns
    and expressions with a condition added. Every row set that satisfied ``old`` satisfies ``new``, so it
    cannot fail on existing rows nor refuse a write the previous release makes (DDL is transactional:
    no window without either)."""
    if not isinstance(old, models.UniqueConstraint) or not isinstance(new, models.UniqueConstraint):
        return False
    if old.condition is not None or new.condition is None:
        return False
    return (old.fields, old.expressions, old.include, old.opclasses) == (
        new.fields,
        new.expressions,
        new.include,
        new.opclasses,
    )


def violations(migration: Migration, before: ProjectState) -> list[Violation]:
    """What in ``migration`` would break the previous release's code on the new schema (``before``: the state
    the migration starts from)."""
    if migration.initial or getattr(migration, "contract", None):
        return []
    found: list[Violation] = []
    state = before.clone()
    created: set[str] = set()
    removed: dict[tuple[str, str], models.BaseConstraint] = {}  # (model, name) -> a constraint this migration dropped
    name = f"{migration.app_label}.{migration.name}"
    for op in migration.operations:
        described = op.describe()
        if isinstance(op, migrations.CreateModel):
            created.add(op.name_lower)
        elif isinstance(op, _REMOVALS):
            found.append(Violation(name, described, "removes or renames: do it in a contract step a release later"))
        elif isinstance(op, migrations.AddField):
            field = op.field
            fills_itself = field.null or field.db_default is not models.NOT_PROVIDED or field.many_to_many
            if not fills_itself and op.model_name_lower not in created:
                found.append(Violation(name, described, "a NOT NULL column without db_default"))
        elif isinstance(op, migrations.AlterField) and op.model_name_lower not in created:
            old = state.models[migration.app_label, op.model_name_lower].fields[op.name]
            if old.null and not op.field.null:
                found.append(Violation(name, described, "makes a column NOT NULL in place"))
            if type(old) is not type(op.field):
                found.append(Violation(name, described, "changes a column's type in place"))
        elif isinstance(op, migrations.RemoveConstraint):
            model = state.models[migration.app_label, op.model_name_lower]
            for old_constraint in model.options.get("constraints", []):
                if old_constraint.name == op.name:
                    removed[op.model_name_lower, op.name] = old_constraint
        elif isinstance(op, migrations.AddConstraint) and op.model_name_lower not in created:
            constraint = op.constraint
            if narrows(removed.get((op.model_name_lower, constraint.name)), constraint):
                pass  # holds for fewer rows than the one it replaces: existing rows and old code satisfy it
            elif isinstance(constraint, models.UniqueConstraint | models.CheckConstraint):
                found.append(Violation(name, described, "a UNIQUE or CHECK constraint on an existing table"))
        op.state_forwards(migration.app_label, state)
    return found


def _gantry_migrations(loader: MigrationLoader) -> list[tuple[tuple[str, str], Migration]]:
    return sorted(
        (key, migration)
        for key, migration in loader.disk_migrations.items()
        if type(migration).__module__.startswith("gantry.")
    )


def test_every_migration_keeps_the_previous_release_working() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    checked = _gantry_migrations(loader)
    assert len(checked) >= 17  # the files were found: core alone has 0001-0017
    problems = []
    for key, migration in checked:
        before = loader.project_state(key, at_end=False)
        for v in violations(migration, before):
            if key not in GRANDFATHERED:
                problems.append(v)
    assert problems == [], "\n".join(f"{v.migration}: {v.operation}: {v.why}" for v in problems)


def test_the_grandfathered_list_names_only_migrations_that_need_it() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    for key in GRANDFATHERED:
        migration = loader.disk_migrations[key]
        assert violations(migration, loader.project_state(key, at_end=False)), key


def test_it_refuses_what_would_break_the_previous_release() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    state = loader.project_state()  # the latest schema
    bad = type(
        "Migration",
        (migrations.Migration,),
        {
            "operations": [
                migrations.AddField("run", "priority", models.IntegerField(default=0)),
                migrations.AddField("run", "note", models.TextField(null=True)),
                migrations.AddField("run", "weight", models.IntegerField(db_default=1, default=1)),
                migrations.AlterField("run", "failure_reason", models.IntegerField(default=0)),
                migrations.RemoveField("run", "sealed_chunks"),
                migrations.RenameField("stack", "name", "title"),
                migrations.AddConstraint(
                    "stack", models.UniqueConstraint(fields=["organization", "created_at"], name="stack_made_once")
                ),
            ]
        },
    )("9999_bad", "core")
    whys = [v.why for v in violations(bad, state)]
    assert whys == [
        "a NOT NULL column without db_default",
        "changes a column's type in place",
        "removes or renames: do it in a contract step a release later",
        "removes or renames: do it in a contract step a release later",
        "a UNIQUE or CHECK constraint on an existing table",
    ]
    bad.contract = "run.sealed_chunks: unused since release N (test)"
    assert violations(bad, state) == []


def test_it_lets_a_unique_constraint_become_partial_but_not_stricter() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    key = ("core", "0018_stack_archived_at")  # full unique on (org, lower(name)) made partial: allowed
    assert violations(loader.disk_migrations[key], loader.project_state(key, at_end=False)) == []
    state = loader.project_state()
    partial = next(
        c for c in state.models["core", "stack"].options["constraints"] if c.name == "stack_org_name_ci_uniq"
    )
    stricter = models.UniqueConstraint(*partial.expressions, name=partial.name)  # the condition dropped
    back = type(
        "Migration",
        (migrations.Migration,),
        {
            "operations": [
                migrations.RemoveConstraint(model_name="stack", name=partial.name),
                migrations.AddConstraint(model_name="stack", constraint=stricter),
            ]
        },
    )("9999_stricter", "core")
    assert [v.why for v in violations(back, state)] == ["a UNIQUE or CHECK constraint on an existing table"]
