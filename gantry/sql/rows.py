"""Model instances from a statement's rows, without the ORM's query building (gantry.sql.statement).

Rows come back as tuples; :func:`instance` turns one into a model instance as
a queryset would, so services still hand ``Run``/``Runner`` objects to callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model
from django.db.models.base import ModelState

M = TypeVar("M", bound=Model)


def columns(model: type[Model], alias: str = "") -> str:
    """The model's concrete columns as a select list, in :func:`instance`'s order."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f'{prefix}"{f.column}"' for f in model._meta.concrete_fields)


def width(model: type[Model]) -> int:
    return len(model._meta.concrete_fields)


def instance(model: type[M], row: Sequence[Any], offset: int = 0) -> M:
    """A model instance from ``row[offset:]`` laid out as :func:`columns`, as the ORM would build it (no query).

    Field converters run as in a queryset (a JSON column arrives as text: Django
    tells psycopg not to parse it, and the field's ``from_db_value`` does).
    """
    db = connections[DEFAULT_DB_ALIAS]
    values = {}
    for i, f in enumerate(model._meta.concrete_fields):
        value = row[offset + i]
        convert = getattr(f, "from_db_value", None)
        if convert is not None and value is not None:
            value = convert(value, None, db)
        values[f.attname] = value
    return loaded(model, **values)


def loaded(model: type[M], **values: Any) -> M:
    """A saved instance holding ``values`` (attnames); any other field loads on first access, as a deferred one.

    Built as Django unpickles a model (``Model.__reduce__``): without running
    ``__init__``, whose per-field defaults and signals cost more than a hot
    route's statement (the models here have no init-signal receivers).
    """
    obj = model.__new__(model)
    obj.__dict__.update(values)
    state = ModelState()
    state.adding = False
    state.db = DEFAULT_DB_ALIAS
    obj._state = state
    return obj
