"""What the runner and the server must agree on, written once (standard library only).

The client side (coordinator, ephemeral runner, launchers) imports these, and
so does the server wherever it needs the same value: the run statuses that end
a run, the log's chunk size and seal interval, the marker lines the log can
end with, the environment a runner passes on, and the bound on a reconcile
report. A test (tests/runners/test_protocol.py) keeps the server's own
definitions equal to these where it has its own.
"""

from __future__ import annotations

# The run statuses after which nothing changes (the server's models.TERMINAL).
TERMINAL_STATUSES = frozenset({"succeeded", "failure", "cancelled", "discarded", "startup_timeout"})

# A sealed log chunk holds at most this many bytes (RunContext's logs.chunk_size_bytes)...
CHUNK_SIZE = 1024 * 1024
# ...and is sealed at the latest this many seconds after it began (logs.seal_interval_s),
# so a slow trickle of output still reaches durable storage.
SEAL_INTERVAL = 30

# Per-line times (docs/logs.md, "Line times"): beside each chunk the runner sends
# a list of [offset in the chunk, epoch milliseconds] marks, one when a chunk
# begins and one more per write at least TIME_MARK_EVERY_MS after the last, so
# every line's time is that of the mark at or before its first byte. At most
# TIME_MARKS_MAX marks per chunk (a chunk lives at most SEAL_INTERVAL seconds).
TIME_MARK_EVERY_MS = 100
TIME_MARKS_MAX = 1024


def truncation_line(max_bytes: int) -> bytes:
    """The line a log ends with when its run wrote more than ``max_bytes`` (docs/logs.md)."""
    return f"[gantry: log truncated at {max_bytes} bytes (GANTRY_LOG_MAX_BYTES)]\n".encode()


# What a step inherits from the runner's own environment; everything else
# (the runner token above all) stays out.
STEP_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM")
# What a runner a launcher starts inherits from the coordinator's environment
# (plus a launcher's own pass-through list): the step's set and the runner's knobs.
RUNNER_INHERITED_ENV = (*STEP_INHERITED_ENV, "VIRTUAL_ENV", "GANTRY_LOG_LEVEL", "GANTRY_STOP_GRACE")

# Most workers one reconcile report may carry (the server's RECONCILE_MAX_WORKERS):
# a coordinator with more sends several reports.
RECONCILE_MAX_WORKERS = 1000

# The version of this repository's programs (pyproject.toml's; tests/runners/test_protocol.py keeps them equal):
# the coordinator sends it on its polls.
VERSION = "0.1.0"

# A coordinator names itself on every poll (docs/protocol.md, "Coordinator identity"); all three are
# optional, so an older coordinator still polls. Each value is visible ASCII (no spaces), at most so long.
COORDINATOR_ID_HEADER = "X-Gantry-Coordinator-Id"  # one per coordinator process (a uuid4 at start)
COORDINATOR_HOST_HEADER = "X-Gantry-Coordinator-Host"  # its host name
COORDINATOR_VERSION_HEADER = "X-Gantry-Coordinator-Version"  # VERSION
COORDINATOR_HEADER_MAX = {COORDINATOR_ID_HEADER: 64, COORDINATOR_HOST_HEADER: 255, COORDINATOR_VERSION_HEADER: 64}
