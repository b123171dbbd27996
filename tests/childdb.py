"""DATABASE_URL for a child process a test starts (a server, a Celery worker): the test's own database."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def database_url() -> str:
    """The test database this test's rows are committed to, as a URL the child's settings read."""
    params = conninfo_to_dict(make_conninfo(settings.DATABASE_URL, dbname=connection.settings_dict["NAME"]))
    user, host = params.get("user", "postgres"), params.get("host", "127.0.0.1")
    port, name = params.get("port", "5432"), params["dbname"]
    password = f":{params['password']}" if params.get("password") else ""
    if str(host).startswith("/"):  # a Unix socket folder (the embedded PostgreSQL)
        return f"postgres://{user}{password}@/{name}?host={host}&port={port}"
    return f"postgres://{user}{password}@{host}:{port}/{name}"
