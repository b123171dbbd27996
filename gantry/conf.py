"""Every ``GANTRY_*`` variable the server reads, read and checked here, each with its default written once.

No other module under ``gantry/`` reads the environment for a ``GANTRY_*``
name (``tests/test_layers.py``); they ask this one, each value parsed and
validated in one place:

- :func:`django`: what ``settings.py`` hands Django and its libraries (the
  services' URLs, keys, hosts, the pool, the log store), under Django's names
  there;
- :func:`data_dir`: the data folder (``embedded.py``, the generated secret
  key, the local log store);
- :func:`get`: Gantry's own timings and switches (the reapers, the claim, the
  runner's intervals, retention);
- :func:`github`: the instance's GitHub access, for github_actions groups;
- the server process's knobs (``gantry.asgi``), in the last section.

A malformed value (a word where a number belongs, a number out of bounds, an
unknown boolean) stops the process at start with ``ImproperlyConfigured``
naming the variable, never a silent default: the readers in ``gantry/env.py``
raise it, and the checks below. docs/configuration.md lists every variable.
Durations are whole seconds. Read through these (cached) functions, never
``os.environ``.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from gantry.env import envbool, envint, envlist, envseconds, envstr

# The folder holding manage.py (settings.BASE_DIR).
BASE_DIR = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- Django and its libraries (settings.py)


@dataclass(frozen=True)
class DjangoConf:
    """What settings.py hands Django and its libraries; settings keeps Django's names and the fallbacks.

    Secrets and URLs (which may carry a password) stay out of ``repr``.
    """

    debug: bool
    # GANTRY_SECRET_KEY, else DJANGO_SECRET_KEY; empty: settings keeps a generated one in the data folder.
    secret_key: str = field(repr=False)
    allowed_hosts: list[str]
    csrf_trusted_origins: list[str]
    secure_cookies: bool
    # PASSWORD_RESET_TIMEOUT: a new user's set-password link, in seconds.
    password_link_ttl: int
    # The root logger's level, upper case.
    log_level: str
    # Empty: the embedded PostgreSQL / Redis, on the development path only (settings refuses otherwise).
    database_url: str = field(repr=False)
    redis_url: str = field(repr=False)
    # Use the embedded databases outside the development path.
    embedded: bool
    # A Redis database number (0-15) replacing the URL's own; None keeps the URL's.
    redis_db: int | None
    db_pool: bool
    db_pool_min: int
    db_pool_max: int
    db_pool_timeout: int
    # The test suite's database (pytest-django); empty: Django's test_<name>.
    test_database_name: str
    # Empty: REDIS_URL.
    celery_broker_url: str = field(repr=False)
    celery_queue: str
    # Group and runner JWT signing keys by kid, the signing one first; empty: settings signs with SECRET_KEY.
    jwt_keys: dict[str, str] = field(repr=False)
    # Fernet keys for stack secrets, comma separated, as given (gantry/core/secrets.py parses them).
    secrets_keys: str = field(repr=False)
    # Sealed log chunks: S3 when a bucket is named, else files under log_dir (empty: <data folder>/logs).
    log_dir: str
    s3_bucket: str
    s3_prefix: str
    s3_endpoint_url: str
    s3_region: str
    s3_addressing_style: str


def _redis_db() -> int | None:
    raw = envstr("GANTRY_REDIS_DB")
    if not raw:
        return None
    if not raw.isdigit() or not 0 <= int(raw) <= 15:
        raise ImproperlyConfigured(f"GANTRY_REDIS_DB must be a Redis database number from 0 to 15, not {raw!r}")
    return int(raw)


def _jwt_keys() -> dict[str, str]:
    """``kid:secret,kid2:secret2``: the first signs, all verify, so a key can be rotated in."""
    keys: dict[str, str] = {}
    raw = envstr("GANTRY_JWT_KEYS")
    if not raw:
        return keys
    for item in raw.split(","):
        kid, sep, secret = item.strip().partition(":")
        if not sep or not kid or len(secret) < 32:
            raise ImproperlyConfigured("GANTRY_JWT_KEYS must be 'kid:secret,...' with secrets of 32+ characters")
        keys[kid] = secret
    return keys


def _secrets_keys() -> str:
    raw = envstr("GANTRY_SECRETS_KEYS")
    for key in filter(None, (k.strip() for k in raw.split(","))):
        from cryptography.fernet import Fernet

        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ImproperlyConfigured(
                "GANTRY_SECRETS_KEYS must be comma-separated Fernet keys (python -c 'from cryptography.fernet "
                "import Fernet; print(Fernet.generate_key().decode())')"
            ) from None
    return raw


def _s3_addressing_style() -> str:
    style = envstr("GANTRY_S3_ADDRESSING_STYLE", "auto")
    if style not in ("auto", "path", "virtual"):
        raise ImproperlyConfigured("GANTRY_S3_ADDRESSING_STYLE must be auto, path or virtual")
    return style


def _log_level() -> str:
    level = (envstr("GANTRY_LOG_LEVEL") or "INFO").strip().upper()
    if level not in logging.getLevelNamesMapping():
        raise ImproperlyConfigured(f"GANTRY_LOG_LEVEL={level!r} is not a level (DEBUG, INFO, WARNING, ERROR)")
    return level


@functools.cache
def django() -> DjangoConf:
    return DjangoConf(
        debug=envbool("GANTRY_DEBUG", False),
        secret_key=envstr("GANTRY_SECRET_KEY") or envstr("DJANGO_SECRET_KEY"),
        allowed_hosts=envlist("GANTRY_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"]),
        csrf_trusted_origins=envlist("GANTRY_CSRF_TRUSTED_ORIGINS", []),
        secure_cookies=envbool("GANTRY_SECURE_COOKIES", False),
        password_link_ttl=envint("GANTRY_PASSWORD_LINK_TTL", 3 * 24 * 3600, minimum=60),
        log_level=_log_level(),
        database_url=envstr("DATABASE_URL"),
        redis_url=envstr("REDIS_URL"),
        embedded=envbool("GANTRY_EMBEDDED", False),
        redis_db=_redis_db(),
        db_pool=envbool("GANTRY_DB_POOL", True),
        db_pool_min=envint("GANTRY_DB_POOL_MIN", 2, minimum=0),
        db_pool_max=envint("GANTRY_DB_POOL_MAX", 20, minimum=1),
        db_pool_timeout=envint("GANTRY_DB_POOL_TIMEOUT", 10, minimum=1),
        test_database_name=envstr("GANTRY_TEST_DATABASE_NAME"),
        celery_broker_url=envstr("CELERY_BROKER_URL"),
        celery_queue=envstr("GANTRY_CELERY_QUEUE") or "gantry",
        jwt_keys=_jwt_keys(),
        secrets_keys=_secrets_keys(),
        log_dir=envstr("GANTRY_LOG_DIR"),
        s3_bucket=envstr("GANTRY_S3_BUCKET"),
        s3_prefix=envstr("GANTRY_S3_PREFIX"),
        # boto3 finds credentials itself (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, profiles, instance roles).
        s3_endpoint_url=envstr("GANTRY_S3_ENDPOINT_URL") or envstr("AWS_ENDPOINT_URL_S3") or envstr("AWS_ENDPOINT_URL"),
        s3_region=envstr("GANTRY_S3_REGION") or envstr("AWS_REGION") or envstr("AWS_DEFAULT_REGION"),
        s3_addressing_style=_s3_addressing_style(),
    )


# ---------------------------------------------------------------- the data folder (embedded.py)


def data_dir() -> Path:
    """``GANTRY_DATA_DIR``, else ``.gantry-data`` beside manage.py; not created here (``embedded.data_dir`` does).

    ``dev.py``, which cannot import this module, applies the same rule.
    """
    return Path(os.environ.get("GANTRY_DATA_DIR") or BASE_DIR / ".gantry-data").expanduser().resolve()


# ---------------------------------------------------------------- Gantry's knobs


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
    # Finished runs (and their events, logs, live records and webhook deliveries) are kept this many days after they
    # finished, then removed by the retention reaper; 0 keeps them for ever (docs/reapers.md).
    retention_days: int = 30
    # Runs the retention reaper deletes per transaction, and most finished runs it examines per tick.
    retention_batch_size: int = 500
    retention_max_rows: int = 10_000
    # /metrics access (docs/queue.md, "Who may scrape"): a bearer token (empty: none accepted) or a peer
    # address inside one of these networks (empty: none); the database-derived series are kept this many
    # seconds per process, so any number of scrapers cost one set of statements per period.
    metrics_token: str = field(default="", repr=False)
    metrics_allow: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    metrics_cache_seconds: float = 5.0
    # Whether beat runs the backend dispatcher inside the Celery worker (with GitHub configured).
    # Off where `manage.py dispatcher` runs as processes of their own (deploy/kubernetes), so the
    # workers keep both their processes for the reapers; several dispatchers at once are safe either way.
    dispatch_in_worker: bool = True
    # A waiting run's effective priority rises one level per this many seconds pending (docs/queue.md),
    # so a low run waits at most about twice this behind a steady stream of high ones.
    priority_aging_seconds: int = 900
    # The window over which a group's recent hand-out rate is read for a waiting run's expected start.
    queue_rate_window: int = 600
    # Webhook endpoints may resolve to private, loopback or link-local addresses (tests, a private network's
    # receivers); off, they are refused at registration and at send time (docs/webhooks.md).
    webhook_allow_private: bool = False

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


# Loopback only: a scraper on the host itself, never a client behind a proxy (whose peer is the proxy).
METRICS_ALLOW_DEFAULT = ["127.0.0.1/32", "::1/128"]


def _metrics_allow() -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    networks = []
    for item in envlist("GANTRY_METRICS_ALLOW", METRICS_ALLOW_DEFAULT):
        try:
            networks.append(ipaddress.ip_network(item))
        except ValueError:
            # strict parsing: 10.1.2.3/8 (host bits set) is more likely a typo than a wish for all of 10/8.
            raise ImproperlyConfigured(
                f"GANTRY_METRICS_ALLOW must be comma-separated networks (10.0.0.0/8, ::1/128), not {item!r}"
            ) from None
    return tuple(networks)


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
        metrics_token=envstr("GANTRY_METRICS_TOKEN"),
        metrics_allow=_metrics_allow(),
        metrics_cache_seconds=envseconds("GANTRY_METRICS_CACHE_SECONDS", 5.0, minimum=0.0, maximum=300.0),
        dispatch_in_worker=envbool("GANTRY_DISPATCH_IN_WORKER", True),
        # At most a day per level: the claim computes levels in whole seconds, and no queue should need more.
        priority_aging_seconds=envint("GANTRY_PRIORITY_AGING_SECONDS", 900, minimum=1, maximum=86_400),
        queue_rate_window=envint("GANTRY_QUEUE_RATE_WINDOW", 600, minimum=10, maximum=86_400),
        webhook_allow_private=envbool("GANTRY_WEBHOOK_ALLOW_PRIVATE", False),
    )
    conf.check()
    return conf


# ---------------------------------------------------------------- GitHub (github_actions groups)

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


@functools.cache
def server() -> ServerConf:
    return ServerConf(
        sync_threads=envint("GANTRY_SYNC_THREADS", 16, minimum=1, maximum=1024),
        poll_threads=envint("GANTRY_POLL_THREADS", 3, minimum=1, maximum=1024),
        fast_lane=envbool("GANTRY_FAST_LANE", True),
        lane_db_pool_max=envint("GANTRY_LANE_DB_POOL_MAX", 8, minimum=1, maximum=1024),
        fast_lane_loop=envbool("GANTRY_FAST_LANE_LOOP", True),
        poll_recheck_seconds=envseconds("GANTRY_POLL_RECHECK_SECONDS", 5.0, minimum=0.1, maximum=300.0),
    )
