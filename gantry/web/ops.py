"""Operational endpoints: liveness, readiness, metrics."""

from __future__ import annotations

import logging

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gantry import metrics as gantry_metrics

log = logging.getLogger("gantry.metrics")


def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving; says nothing about its dependencies."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Ready to take traffic: the database and Redis both answer."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure means not ready; say which
        checks["database"] = f"error: {exc.__class__.__name__}: {exc}"
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        client.ping()
        client.close()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {exc.__class__.__name__}: {exc}"
    ok = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text: the in-process metrics, then the ones computed at scrape time (docs/queue.md)."""
    body = generate_latest(REGISTRY)
    try:
        body += generate_latest(gantry_metrics.SCRAPE_REGISTRY)
    except Exception as exc:  # the database is down: still serve what this process knows
        log.warning("scrape-time metrics unavailable: %s", exc, extra={"event": "metrics.scrape_failed"})
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
