"""What every benchmark needs before it measures: the database and Redis database it is given, and Django set up.

The rule, the same for every benchmark (``--help`` prints it: :data:`SERVICES_HELP`):

- PostgreSQL: exactly the database ``DATABASE_URL`` names (each benchmark has
  a ``gantry_bench_*`` default for when it is unset). It is created when
  missing and migrated, and the benchmark writes to Gantry's tables in it
  (most TRUNCATE them), so it must be a scratch database: one that holds a
  superuser (someone's Gantry: ``dev.py run`` and production make one, no
  benchmark does) is refused.
- Redis: the server ``REDIS_URL`` names (default ``redis://127.0.0.1:6379/0``),
  on a database of the benchmark's own: ``GANTRY_REDIS_DB`` when given, else
  four above ``REDIS_URL``'s (the tests run eight above it, ``dev.py test``),
  so a benchmark never writes to, or deletes keys of, the database a server
  or the tests use.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

# A benchmark's Redis database is this many above the configured one (modulo 16).
REDIS_DB_OFFSET = 4
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

SERVICES_HELP = """\
PostgreSQL: exactly the database DATABASE_URL names (default: this benchmark's
gantry_bench_* database on 127.0.0.1), created when missing and migrated; the
benchmark writes to (most TRUNCATE) Gantry's tables in it, so name a scratch
database: one holding a superuser (someone's Gantry) is refused.
Redis: the server REDIS_URL names (default redis://127.0.0.1:6379/0), on a
database of the benchmark's own: GANTRY_REDIS_DB when given, else four above
REDIS_URL's, so the configured database (a server's, the tests') is never
written to."""


def database_url(default: str) -> str:
    """The database the benchmark uses: exactly the one ``DATABASE_URL`` names, else ``default``."""
    url = os.environ.get("DATABASE_URL") or default
    if not unquote(urlsplit(url).path.lstrip("/")):
        sys.exit(f"DATABASE_URL names no database ({url}): name the scratch database the benchmark may fill")
    return url


def redis_db() -> int:
    """The benchmark's Redis database number: ``GANTRY_REDIS_DB``, else four above ``REDIS_URL``'s."""
    given = os.environ.get("GANTRY_REDIS_DB")
    if given:
        return int(given)
    path = urlsplit(os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL).path.strip("/")
    return ((int(path) if path.isdigit() else 0) + REDIS_DB_OFFSET) % 16


def bootstrap(url: str) -> None:
    """Point Django at ``url`` (created when missing, refused if it holds a superuser) and the
    benchmark's own Redis database, set Django up and migrate.

    A secret key is given a default so settings never write a key file into the checkout.
    Child processes (a server the benchmark starts) inherit the same ``DATABASE_URL``,
    ``REDIS_URL`` and ``GANTRY_REDIS_DB``.
    """
    db = redis_db()
    redis_url = urlsplit(os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL)._replace(path=f"/{db}").geturl()
    os.environ["DATABASE_URL"] = url
    os.environ["REDIS_URL"] = redis_url
    os.environ["GANTRY_REDIS_DB"] = str(db)  # what settings apply; the URL above says the same
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gantry.settings")
    os.environ.setdefault("GANTRY_SECRET_KEY", "bench-" + "x" * 50)
    ensure_database(url)
    parts = urlsplit(url)
    print(f"benchmark database {unquote(parts.path.lstrip('/'))} on {parts.hostname}:{parts.port or 5432}; "
          f"Redis {redis_url}", flush=True)  # fmt: skip

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def ensure_database(url: str) -> None:
    """Create the database when missing; refuse one that holds a superuser (someone's Gantry, not a scratch one)."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")
            return
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('auth_user')").fetchone() == (None,):
            return
        row = conn.execute("SELECT count(*) FROM auth_user WHERE is_superuser").fetchone()
    if row and row[0]:
        sys.exit(
            f"DATABASE_URL names {name}, which holds {row[0]} superuser(s): someone's Gantry, whose tables the "
            f"benchmark would fill or TRUNCATE. Name a scratch database instead (created when missing), e.g. "
            f"{urlunsplit(parts._replace(path='/gantry_bench'))}"
        )


def execute(query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one statement on this thread's connection (autocommit unless inside atomic)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        return list(cur.fetchall()) if cur.description else []
