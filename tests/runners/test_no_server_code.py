"""The client programs (runners/, launchers/, and the gantry_wire/ they share with the server) load no server code.

Anything under ``gantry`` pulls in Django's settings and the Celery app; a
runner starting per run would pay for it every time, and a machine that runs
only coordinators would need the server's dependencies. Checked in a fresh
interpreter, since this test process has loaded everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CLIENT_MODULES = [
    "gantry_wire.logsetup",
    "gantry_wire.procfs",
    "gantry_wire.protocol",
    "runners.client",
    "runners.coordinator",
    "runners.ephemeral",
    "runners.logbuf",
    "runners.steps",
    "launchers",
    "launchers.local",
    "launchers.docker",
]
SERVER_PACKAGES = ("gantry", "django", "rest_framework", "celery", "psycopg", "redis")


def test_importing_the_client_programs_loads_no_server_package() -> None:
    probe = (
        "import importlib, json, sys\n"
        f"for name in {CLIENT_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    loaded = json.loads(out)

    server = [m for m in loaded if m.split(".")[0] in SERVER_PACKAGES]
    assert server == [], server
    assert set(CLIENT_MODULES) <= set(loaded)
