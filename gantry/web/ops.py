"""Operational endpoints: liveness, readiness, metrics."""

from __future__ import annotations

import hmac
import ipaddress
import logging

import psycopg
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gantry import conf
from gantry import metrics as gantry_metrics
from gantry.core import errors
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


def _metrics_refusal(request: HttpRequest) -> JsonResponse | None:
    """Why this request may not scrape (a 401 or 403 answer), or None when it may (docs/queue.md, "Who may scrape").

    The series name every org, its queue and its groups: a bearer token
    (GANTRY_METRICS_TOKEN) or a peer address inside GANTRY_METRICS_ALLOW. The
    address is the socket's peer (REMOTE_ADDR), never X-Forwarded-For, which any
    client can write; behind a proxy every client has the proxy's address, so
    there the token is the way in.
    """
    cfg = conf.get()
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme or given:
        # Credentials that do not match are refused even from an allowed address:
        # a scraper sending a stale token should hear so, not be let in by where it stands.
        ok = (
            scheme.lower() == "bearer"
            and bool(cfg.metrics_token)
            and hmac.compare_digest(given.strip().encode(), cfg.metrics_token.encode())
        )
        if ok:
            return None
        return JsonResponse({"code": errors.Forbidden.code, "detail": "this token may not read /metrics"}, status=403)
    try:
        peer = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        peer = None
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped  # a dual-stack listener's IPv4 client: the IPv4 networks apply
    if peer is not None and any(peer in network for network in cfg.metrics_allow):
        return None
    refused = JsonResponse(
        {
            "code": errors.NotAuthenticated.code,
            "detail": "/metrics needs Authorization: Bearer <GANTRY_METRICS_TOKEN> "
            "or an address in GANTRY_METRICS_ALLOW",
        },
        status=401,
    )
    refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return refused


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text: the in-process metrics, then the ones computed at scrape time (docs/queue.md)."""
    refusal = _metrics_refusal(request)
    if refusal is not None:
        return refusal
    body = generate_latest(REGISTRY)
    try:
        body += generate_latest(gantry_metrics.SCRAPE_REGISTRY)
    except Exception as exc:  # the database is down: still serve what this process knows
        log.warning("scrape-time metrics unavailable: %s", exc, extra={"event": "metrics.scrape_failed"})
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
