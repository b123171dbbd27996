"""Gantry's raw SQL, in one package: each statement named once, beside the rule it writes.

- ``statement`` — the prepared-statement mechanism every statement goes through, and its drivers
- ``rows`` — model instances from rows, without the ORM's query building
- ``runs`` — every change of a run's status: one builder, one definition of each effect
- ``runners`` — runner rows: ready, the heartbeat, deregister, holding a run, the sweeps' reads
- ``claim`` — the poll's one-statement claim, the rules of what may be claimed (``claimable``, ``has_room``,
  ``serves``) that the long poll, the dispatcher and the queue compose too, and the long poll's LISTEN
- ``auth`` — authentication's reads: a token's group, a runner's row
- ``logs`` — the live push's check; what a log flush reads and records
- ``queue`` — the queue's reads: waiting runs, groups with their selectors, demand counts
- ``dispatcher`` — the backend dispatcher: candidates, in-flight, its org locks, workflow runs' passes
- ``reapers`` — the reapers' selections, the stub and runner deletes, the queued flushes
- ``retention`` — the retention scan, its delete and the log-purge outbox
- ``ops`` — readiness's probe
- ``session`` — session settings for connections Django does not set up (the lane's pool)
- ``bootstrap`` — the embedded PostgreSQL's, read before Django's settings exist (imports neither Django
  nor gantry.core, so neither may this package's ``__init__``)

No raw SQL lives outside this package and the migrations (tests/test_layers.py),
and only ``statement`` sends ``PREPARE``.

Django's ORM still serves the plain reads and the rows no rule depends on;
what is written here is what the ORM cannot say in one statement, or what a
hot path cannot afford to compile per call. Status lists are SQL literals
(:func:`literals`), never parameters, so a statement's plan can match the
partial indexes on ``run``.
"""

from __future__ import annotations

from collections.abc import Iterable


def literals(states: Iterable[str]) -> str:
    """A status list as SQL literals, never parameters, so partial indexes match."""
    return ", ".join(f"'{status}'" for status in sorted(states))
