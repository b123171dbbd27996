"""Django settings, all from the environment (see docs/configuration.md).

Every variable is read and checked in ``gantry.conf``, this module's values
(``conf.django()``) and Gantry's own knobs (``conf.get()``) alike; this module
only shapes them into what Django and its libraries need.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from gantry import conf, embedded

BASE_DIR = Path(__file__).resolve().parent.parent

# Read and checked at once, so a malformed variable stops the process here.
_env = conf.django()

DEBUG = _env.debug


# The embedded PostgreSQL and Redis (gantry/embedded.py) are the development
# path: `dev.py` sets GANTRY_EMBEDDED=1, a data folder that already holds them
# is a checkout where `dev.py run` ran (so `manage.py` there needs nothing set),
# the test suite runs under pytest, mypy's Django plugin loads these settings,
# and DEBUG is a developer's switch. A production server missing DATABASE_URL or
# REDIS_URL must stop here, not quietly boot databases of its own in a folder;
# checked before the secret key below, so a refused start writes nothing.
# manage.py prints this message as one line (exit 2).
if not (_env.database_url and _env.redis_url) and not (
    DEBUG or _env.embedded or "pytest" in sys.modules or "mypy" in sys.modules or embedded.already_here()
):
    raise ImproperlyConfigured(
        "DATABASE_URL and REDIS_URL must be set (postgres://... and redis://...); the embedded databases are for "
        "development only: run `python3 dev.py run` or `python3 dev.py manage ARGS`, or set GANTRY_EMBEDDED=1"
    )


def _secret_key() -> str:
    if _env.secret_key:
        return _env.secret_key
    # No key configured: keep one in the data folder so sessions and signed
    # tokens survive a restart of a local installation.
    path = embedded.data_dir() / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = list(_env.allowed_hosts)
CSRF_TRUSTED_ORIGINS = list(_env.csrf_trusted_origins)
# A refused form post gets the site's styled page (gantry.web.errors), not Django's bare one.
CSRF_FAILURE_VIEW = "gantry.web.errors.csrf_failure"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "gantry.core",
    "gantry.api",
    "gantry.dispatch",
    "gantry.web",
    "gantry.logs",
    "gantry.reapers",
    "gantry.webhooks",
]

MIDDLEWARE = [
    # First, so it times everything below it (docs/queue.md, "Metrics").
    "gantry.web.http_metrics.HttpMetricsMiddleware",
    # First: a body over the limit is refused before anything could read it.
    "gantry.web.middleware.BodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "gantry.urls"
WSGI_APPLICATION = "gantry.wsgi.application"
# Paths in the contract have no trailing slash; never redirect to add one.
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_from_url(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(f"DATABASE_URL must be a postgres:// URL, not {parts.scheme!r}")
    options: dict[str, object] = dict(parse_qsl(parts.query))
    host = str(options.pop("host", "") or unquote(parts.hostname or ""))
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL names no database")
    if _env.db_pool:
        from psycopg_pool.base import AttemptWithBackoff

        # While the database is down the pool retries each missing connection
        # with exponential backoff (1 s, 2 s, 4 s, ...), so after a restart it
        # could be seconds before it tried again. A steady quarter-second retry
        # costs one refused connect per missing connection and brings the pool
        # back within a beat of the database: /readyz and requests with it.
        AttemptWithBackoff.INITIAL_DELAY = 0.25
        AttemptWithBackoff.DELAY_BACKOFF = 1.0
        # psycopg's pool (Django 5.1+): the poll path reuses warm connections.
        options["pool"] = {
            "min_size": _env.db_pool_min,
            "max_size": _env.db_pool_max,
            "timeout": _env.db_pool_timeout,
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        # A connection is checked before a request uses it: with the pool, as it
        # leaves the pool (gantry/core/pool_check.py: psycopg's empty query, but
        # only when the socket has something to read, which a dropped one has); without,
        # Django's own check of a kept connection. After a database restart a
        # dead connection is then replaced instead of failing the request.
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"NAME": _env.test_database_name or None},
    }


DATABASE_URL = _env.database_url or embedded.postgres_url()
DATABASES = {"default": _database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = _env.redis_url or embedded.redis_url()
# Another database of the same Redis (0-15), replacing the URL's own: the
# test suite runs on one of its own (dev.py test sets it), so it never touches
# a development server's throttle buckets or live logs on the same Redis.
if _env.redis_db is not None:
    REDIS_URL = urlsplit(REDIS_URL)._replace(path=f"/{_env.redis_db}").geturl()

# Sealed log chunks (docs/logs.md): S3 when a bucket is named, else files
# under GANTRY_LOG_DIR (empty: <data folder>/logs, created on first use).
GANTRY_LOG_DIR = _env.log_dir
GANTRY_S3_BUCKET = _env.s3_bucket
GANTRY_S3_PREFIX = _env.s3_prefix
# boto3 finds credentials itself (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
# profiles, instance roles); the endpoint must also be reachable by runners,
# which PUT to presigned URLs on it.
GANTRY_S3_ENDPOINT_URL = _env.s3_endpoint_url
GANTRY_S3_REGION = _env.s3_region
GANTRY_S3_ADDRESSING_STYLE = _env.s3_addressing_style
# A live log push carries up to 2 MiB of gzip as base64 in JSON (~2.8 MB),
# over Django's default of 2.5 MB; the push validates its own cap.
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

# The pages (gantry/web): log in, and a new user's one-time set-password link (Django's
# password-reset token), valid this many seconds.
LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:home"
LOGOUT_REDIRECT_URL = "web:login"
PASSWORD_RESET_TIMEOUT = _env.password_link_ttl

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Serve the admin's assets straight from the installed apps: no collectstatic step.
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gantry.api.auth.BearerJWTAuthentication",
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["gantry.api.parsers.StrictJSONParser"],
    # DRF's negotiation, minus its parsing for a missing or */* Accept (gantry/api/negotiation.py).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "gantry.api.negotiation.FastContentNegotiation",
    "EXCEPTION_HANDLER": "gantry.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Gantry API",
    "DESCRIPTION": "Dispatches queued runs to self-hosted runner groups; see docs/api.md.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "gantry.core.models.RunStatus",
        "DeploymentStatusEnum": "gantry.core.models.DeploymentStatus",
        "RunnerStatusEnum": "gantry.core.models.RunnerStatus",
        "RoleEnum": "gantry.core.models.Role",
        "GroupKindEnum": "gantry.core.models.GroupKind",
        "PriorityEnum": "gantry.core.models.PRIORITY_NAMES",
        "StopReasonEnum": "gantry.reapers.reconcile.STOP_REASONS",
        "WorkerStateEnum": "gantry.reapers.reconcile.WORKER_STATES",
    },
}

# Signing keys for group and runner JWTs: "kid:secret,kid2:secret2"; the
# first signs, all verify, so a key can be rotated in without cutting off
# tokens signed by the old one.
if _env.jwt_keys:
    GANTRY_JWT_KEYS: dict[str, str] = dict(_env.jwt_keys)
    GANTRY_JWT_SIGNING_KID = next(iter(GANTRY_JWT_KEYS))
else:
    GANTRY_JWT_KEYS = {"default": SECRET_KEY}
    GANTRY_JWT_SIGNING_KID = "default"

# Keys that encrypt stack secrets at rest (gantry/core/secrets.py): Fernet keys,
# comma separated; the first encrypts, all decrypt. Empty: one derived from SECRET_KEY.
GANTRY_SECRETS_KEYS = _env.secrets_keys

# Gantry's knobs, read once here so a malformed one stops the process at start.
_conf = conf.get()

CELERY_BROKER_URL = _env.celery_broker_url or REDIS_URL
# Gantry's queue on the broker; installations sharing one Redis each name their own.
CELERY_TASK_DEFAULT_QUEUE = _env.celery_queue
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Beat sending a reaper tick while Redis restarts: retry for about ten seconds
# instead of logging the tick as lost at ERROR (a missed tick is only late work).
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 20, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}
# The tasks' answers go to the logs, never to a result backend.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
# One task at a time per worker process: a sweep is seconds long; nothing gains from prefetching.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep Gantry's JSON log lines (LOGGING below) in the worker too.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The one schedule (docs/reapers.md): each reaper every GANTRY_REAPER_INTERVAL seconds.
# A tick not started within its period expires: the next one does its work.
# Exactly one beat may run (`celery -A gantry beat`, or `worker -B` for one worker).
CELERY_BEAT_SCHEDULE = {
    f"reap-{name.replace('_', '-')}": {
        "task": f"gantry.reapers.{name}",
        "schedule": float(_conf.reaper_interval),
        "options": {"expires": float(_conf.reaper_interval)},
    }
    for name in ("expired_assignments", "inactive_runners", "startup_deadline", "cancellation_backstop", "retention")
}

# Webhook delivery (docs/webhooks.md): kicked by the outbox's NOTIFY after each commit; this tick is the
# backstop (a lost kick) and what sends retries when they fall due (the first within 30 s).
CELERY_BEAT_SCHEDULE["webhooks-deliver"] = {
    "task": "gantry.webhooks.deliver",
    "schedule": 10.0,
    "options": {"expires": 10.0},
}
# Let webhook endpoints resolve to private, loopback or link-local addresses (tests, a closed network):
# GANTRY_WEBHOOK_ALLOW_PRIVATE, read by conf; a setting so a test can flip it for one test.
GANTRY_WEBHOOK_ALLOW_PRIVATE = _conf.webhook_allow_private

# The backend dispatcher (github_actions groups; docs/github-actions.md), when GitHub is configured,
# unless it runs as `manage.py dispatcher` processes of their own (GANTRY_DISPATCH_IN_WORKER=false).
GANTRY_GITHUB = conf.github()
if GANTRY_GITHUB.mode and _conf.dispatch_in_worker:
    CELERY_BEAT_SCHEDULE["dispatch-github"] = {
        "task": "gantry.dispatch.loop",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "gantry_wire.logsetup.JsonFormatter"},  # shared with the client programs
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json"},
    },
    "root": {"handlers": ["console"], "level": _env.log_level},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # One line per GitHub call at INFO; the dispatcher logs what matters.
        "httpx": {"level": "WARNING"},
    },
}

if _env.secure_cookies:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"  # one-time tokens never sit in a cookie
