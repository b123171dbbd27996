"""The embedded PostgreSQL's bootstrap SQL (gantry.embedded), sent before Django's settings exist.

Plain strings, so importing this module imports neither Django nor
gantry.core (tests/test_layers.py): settings call gantry.embedded while they
are being read.
"""

from __future__ import annotations

# Whether the database %s exists (on the server's admin connection).
DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %s"


def create_database(name: str) -> str:
    """``CREATE DATABASE`` for ``name``, a name of Gantry's own: an identifier, which takes no parameter."""
    return f'CREATE DATABASE "{name}"'
