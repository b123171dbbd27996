"""What every benchmark needs before it measures: its own database, migrated, and Django set up."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit


def bootstrap(url: str, *, redis_url: str) -> None:
    """Point Django at ``url`` (created when missing), set it up and migrate.

    ``REDIS_URL`` and a secret key are given defaults so settings never start
    the embedded servers or write a key file into the checkout.
    """
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gantry.settings")
    os.environ.setdefault("REDIS_URL", redis_url)
    os.environ.setdefault("GANTRY_SECRET_KEY", "bench-" + "x" * 50)
    ensure_database(url)

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def ensure_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")


def execute(query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one statement on this thread's connection (autocommit unless inside atomic)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        return list(cur.fetchall()) if cur.description else []
