"""Gantry's own knobs, each with its default written once.

Read through :func:`get` (cached) rather than ``os.environ`` so a value is parsed
and validated in one place. Durations are whole seconds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured

from gantry.env import envbool, envint, envstr


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
    # The backend dispatcher (github_actions groups): candidates one tick looks at,
    # and the period of its backstop tick (a NOTIFY wakes it sooner).
    dispatch_batch_size: int
    dispatch_interval: int
    log_max_bytes: int
    poll_max_wait: int
    # A group none of whose coordinators polled for this long looks offline (the queue's no_runner_polling).
    poll_stale_after: int
    # Finished runs (and their events, logs and live records) are kept this many days after they
    # finished, then removed by the retention reaper; 0 keeps them for ever (docs/reapers.md).
    retention_days: int = 30
    # Runs the retention reaper deletes per transaction, and most finished runs it examines per tick.
    retention_batch_size: int = 500
    retention_max_rows: int = 10_000

    def check(self) -> None:
        if self.stub_cutoff <= self.assignment_ttl:
            raise ImproperlyConfigured(
                "GANTRY_STUB_CUTOFF must be longer than GANTRY_ASSIGNMENT_TTL, "
                "or a booting runner loses its run before its lease ends"
            )
        if self.runner_force_gate < self.assignment_ttl:
            # Force-delete locks runner then run, accept the reverse; the gate
            # keeps them apart only while no accept can be in flight for a runner
            # offline that long, which the lease guarantees (services.runners).
            raise ImproperlyConfigured(
                "GANTRY_RUNNER_FORCE_GATE must be at least GANTRY_ASSIGNMENT_TTL, "
                "or a force-delete could race an accept still within its lease"
            )
        if self.retention_max_rows < self.retention_batch_size:
            raise ImproperlyConfigured("GANTRY_RETENTION_MAX_ROWS must be at least GANTRY_RETENTION_BATCH_SIZE")


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
        dispatch_batch_size=envint("GANTRY_DISPATCH_BATCH_SIZE", 100, minimum=1, maximum=10_000),
        dispatch_interval=envint("GANTRY_DISPATCH_INTERVAL", 5, minimum=1),
        log_max_bytes=envint("GANTRY_LOG_MAX_BYTES", 256 * 1024 * 1024, minimum=1024),
        poll_max_wait=envint("GANTRY_POLL_MAX_WAIT", 30, minimum=0, maximum=30),
        poll_stale_after=envint("GANTRY_POLL_STALE_AFTER", 60, minimum=1),
        # At most a century: the cut-off (now - days) must stay a valid date.
        retention_days=envint("GANTRY_RETENTION_DAYS", 30, minimum=0, maximum=36_500),
        retention_batch_size=envint("GANTRY_RETENTION_BATCH_SIZE", 500, minimum=1, maximum=10_000),
        retention_max_rows=envint("GANTRY_RETENTION_MAX_ROWS", 10_000, minimum=1, maximum=1_000_000),
    )
    conf.check()
    return conf


GITHUB_API_URL = "https://api.github.com"
GITHUB_OIDC_ISSUER = "https://token.actions.githubusercontent.com"


@dataclass(frozen=True)
class GitHubConf:
    """How Gantry reaches GitHub for github_actions groups (docs/github-actions.md).

    The instance's credentials, never a group's: a GitHub App (``app_id`` and
    its private key, from a file) or, for small setups, one token. Secrets are
    kept out of ``repr`` so a logged configuration never shows them.
    """

    api_url: str
    token: str = field(repr=False)
    app_id: str
    app_private_key: str = field(repr=False)
    oidc_issuer: str
    oidc_audience: str
    # The root URL workflow runs reach Gantry at (the workflow's gantry_url input).
    public_url: str

    @property
    def mode(self) -> str:
        """``app``, ``token``, or ``""`` when no credential is configured (nothing is dispatched)."""
        if self.app_id:
            return "app"
        return "token" if self.token else ""

    def check(self) -> None:
        if self.app_id and not self.app_private_key:
            raise ImproperlyConfigured("GANTRY_GITHUB_APP_ID needs GANTRY_GITHUB_APP_PRIVATE_KEY_FILE")
        if self.app_private_key and not self.app_id:
            raise ImproperlyConfigured("GANTRY_GITHUB_APP_PRIVATE_KEY_FILE needs GANTRY_GITHUB_APP_ID")
        for name, url in (
            ("GANTRY_GITHUB_API_URL", self.api_url),
            ("GANTRY_GITHUB_OIDC_ISSUER", self.oidc_issuer),
            ("GANTRY_PUBLIC_URL", self.public_url),
        ):
            if url and not url.startswith(("https://", "http://")):
                raise ImproperlyConfigured(f"{name} must be an http(s):// URL")


def _private_key() -> str:
    path = envstr("GANTRY_GITHUB_APP_PRIVATE_KEY_FILE")
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ImproperlyConfigured(f"GANTRY_GITHUB_APP_PRIVATE_KEY_FILE={path!r} cannot be read: {exc}") from exc


@functools.cache
def github() -> GitHubConf:
    conf = GitHubConf(
        api_url=(envstr("GANTRY_GITHUB_API_URL") or GITHUB_API_URL).rstrip("/"),
        token=envstr("GANTRY_GITHUB_TOKEN"),
        app_id=envstr("GANTRY_GITHUB_APP_ID"),
        app_private_key=_private_key(),
        oidc_issuer=(envstr("GANTRY_GITHUB_OIDC_ISSUER") or GITHUB_OIDC_ISSUER).rstrip("/"),
        oidc_audience=envstr("GANTRY_GITHUB_OIDC_AUDIENCE") or "gantry",
        public_url=envstr("GANTRY_PUBLIC_URL").rstrip("/"),
    )
    conf.check()
    return conf


# ---------------------------------------------------------------- the server process (gantry.server)
#
# Read by the production server mode (``gunicorn gantry.asgi``) when it starts;
# ``gantry.wsgi`` and ``runserver`` read none of them. docs/configuration.md,
# "The server process" and "Diagnostics".


@dataclass(frozen=True)
class ServerConf:
    # Threads per worker for every route but the long poll (the Django WSGI app, through a2wsgi).
    sync_threads: int
    # Threads per worker for the long poll's first attempt (a woken poll's claim has one more of its own).
    poll_threads: int
    # Whether the runner's hot calls are answered by the fast lane (gantry.server.lane) or all by Django.
    fast_lane: bool
    # Connections of the lane's own asyncio pool per event loop (gantry.server.lanedb).
    lane_db_pool_max: int
    # Diagnostics, not for production (docs/configuration.md, "Diagnostics"): the lane's
    # one-statement calls on the request threads instead of the event loop (an A/B), and
    # the period of the long poll's sweep for a lost NOTIFY (tests shorten it).
    fast_lane_loop: bool = True
    poll_recheck_seconds: float = 5.0


def _envseconds(name: str, default: float, *, minimum: float, maximum: float) -> float:
    """Seconds, a fraction allowed (unlike the whole seconds above); malformed or out of range: ImproperlyConfigured
    naming the variable."""
    import os  # here, not at the top: this section stays self-contained

    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number of seconds") from None
    if not minimum <= value <= maximum:  # also refuses nan
        raise ImproperlyConfigured(f"{name}={raw} is outside {minimum:g}-{maximum:g} seconds")
    return value


@functools.cache
def server() -> ServerConf:
    return ServerConf(
        sync_threads=envint("GANTRY_SYNC_THREADS", 16, minimum=1, maximum=1024),
        poll_threads=envint("GANTRY_POLL_THREADS", 3, minimum=1, maximum=1024),
        fast_lane=envbool("GANTRY_FAST_LANE", True),
        lane_db_pool_max=envint("GANTRY_LANE_DB_POOL_MAX", 8, minimum=1, maximum=1024),
        fast_lane_loop=envbool("GANTRY_FAST_LANE_LOOP", True),
        poll_recheck_seconds=_envseconds("GANTRY_POLL_RECHECK_SECONDS", 5.0, minimum=0.1, maximum=300.0),
    )
