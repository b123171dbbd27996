"""Operational endpoints: liveness, readiness, metrics."""

from __future__ import annotations

import logging

import psycopg
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gantry import metrics as gantry_metrics
from gantry.sql import ops as sql

log = logging.getLogger("gantry.metrics")


def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving; says nothing about its dependencies."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Ready to take traffic: the database and Redis both answer.

    The answer names the dependency that failed; the error's own text (host
    names, ports, driver messages) only for a signed-in staff user.
    """
    errors: dict[str, str] = {}
    try:
        # A connection of its own, with a short timeout: the pool would make a
        # probe wait for its own reconnect (up to GANTRY_DB_POOL_TIMEOUT) while
        # the database is down, and answer late; this answers at once either way.
        params = {k: v for k, v in connection.get_connection_params().items() if k not in ("cursor_factory", "context")}
        with psycopg.connect(**params, connect_timeout=2, autocommit=True) as conn:
            conn.execute(sql.READY)
    except Exception as exc:  # any failure means not ready; say which
        errors["database"] = f"{exc.__class__.__name__}: {exc}"
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        client.ping()
        client.close()
    except Exception as exc:
        errors["redis"] = f"{exc.__class__.__name__}: {exc}"
    user = getattr(request, "user", None)
    staff = bool(user is not None and user.is_authenticated and user.is_staff)
    checks = {
        name: "ok" if name not in errors else (f"error: {errors[name]}" if staff else "error")
        for name in ("database", "redis")
    }
    ok = not errors
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text: the in-process metrics, then the ones computed at scrape time (docs/queue.md)."""
    body = generate_latest(REGISTRY)
    try:
        body += generate_latest(gantry_metrics.SCRAPE_REGISTRY)
    except Exception as exc:  # the database is down: still serve what this process knows
        log.warning("scrape-time metrics unavailable: %s", exc, extra={"event": "metrics.scrape_failed"})
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
