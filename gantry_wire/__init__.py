"""What Gantry's server, its runner and its launchers share, written once (standard library only).

- :mod:`gantry_wire.protocol`: the values both ends of the runner protocol
  must agree on (the statuses that end a run, the log's chunk size and seal
  interval, the truncation line, the environment a runner passes on);
- :mod:`gantry_wire.logsetup`: the structured log line (one JSON object, a
  stable ``event`` key) that the server, the coordinator, the runner and the
  launchers all write;
- :mod:`gantry_wire.procfs`: reading processes from /proc, for the runner,
  the local launcher and ``dev.py``.

It sits beside ``gantry/``, ``runners/`` and ``launchers/`` and imports none
of them (``tests/test_layers.py``), so each of those can import it without
loading the others: a runner host or the runner's zipapp carries ``runners/``
and this package, never the server; the server builds a runner's RunContext
from these values without importing the runner. Not under ``gantry/``:
importing anything there loads the Celery app and Django's settings.
"""
