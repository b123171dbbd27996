"""Gantry's own knobs, each with its default written once.

Read through :func:`get` (cached) rather than ``os.environ`` so a value is parsed
and validated in one place. Durations are whole seconds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from gantry.env import envbool, envint


@dataclass(frozen=True)
class GantryConf:
    # How long a poll's tentative claim holds before the reaper returns the run to pending.
    assignment_ttl: int
    # Stub runners (not_ready, or ready but never accepted) older than this are deleted.
    # Longer than the lease, so a booting runner keeps its run.
    stub_cutoff: int
    # A run never started this long after it first became pending is failed as startup_timeout.
    runner_startup_deadline: int
    # A busy runner silent this long is lost: its run fails.
    runner_execution_timeout: int
    # A runner offline this long may be force-deleted by an admin.
    runner_force_gate: int
    status_interval: int
    live_log_interval: int
    reaper_interval: int
    rate_limit_enabled: bool
    dispatch_max_per_org: int
    log_max_bytes: int
    poll_max_wait: int
    # A group none of whose coordinators polled for this long looks offline (the queue's no_runner_polling).
    poll_stale_after: int

    def check(self) -> None:
        if self.stub_cutoff <= self.assignment_ttl:
            raise ImproperlyConfigured(
                "GANTRY_STUB_CUTOFF must be longer than GANTRY_ASSIGNMENT_TTL, "
                "or a booting runner loses its run before its lease ends"
            )


@functools.cache
def get() -> GantryConf:
    conf = GantryConf(
        assignment_ttl=envint("GANTRY_ASSIGNMENT_TTL", 300, minimum=1),
        stub_cutoff=envint("GANTRY_STUB_CUTOFF", 600, minimum=1),
        runner_startup_deadline=envint("GANTRY_RUNNER_STARTUP_DEADLINE", 1800, minimum=1),
        runner_execution_timeout=envint("GANTRY_RUNNER_EXECUTION_TIMEOUT", 3600, minimum=1),
        runner_force_gate=envint("GANTRY_RUNNER_FORCE_GATE", 300, minimum=0),
        status_interval=envint("GANTRY_STATUS_INTERVAL", 5, minimum=1),
        live_log_interval=envint("GANTRY_LIVE_LOG_INTERVAL", 2, minimum=1),
        reaper_interval=envint("GANTRY_REAPER_INTERVAL", 60, minimum=1),
        rate_limit_enabled=envbool("GANTRY_RATE_LIMIT_ENABLED", True),
        dispatch_max_per_org=envint("GANTRY_DISPATCH_MAX_PER_ORG", 50, minimum=1),
        log_max_bytes=envint("GANTRY_LOG_MAX_BYTES", 256 * 1024 * 1024, minimum=1024),
        poll_max_wait=envint("GANTRY_POLL_MAX_WAIT", 30, minimum=0, maximum=300),
        poll_stale_after=envint("GANTRY_POLL_STALE_AFTER", 60, minimum=1),
    )
    conf.check()
    return conf
