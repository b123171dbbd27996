"""HTTP request count and latency by route, for ``/metrics``.

One histogram, ``gantry_http_request_duration_seconds{route, method, status}``;
its ``_count`` is the request count. The labels stay bounded: ``route`` is the
URL pattern that matched (``api/v1/runs/<uuid:run_id>/accept``), never the raw
path, and ``<unmatched>`` for a path no route matched; unknown methods read
``other``. Kept per process, like any in-process Prometheus metric: scrape
each web process (or pod).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from prometheus_client import Histogram

REQUEST_SECONDS = Histogram(
    "gantry_http_request_duration_seconds",
    "HTTP requests by route pattern, method and status, and how long they took.",
    ["route", "method", "status"],
    # A long poll parks up to 30 s.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class HttpMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None and match.route else "<unmatched>"
        method = request.method if request.method in _METHODS else "other"
        REQUEST_SECONDS.labels(route=route, method=method, status=str(response.status_code)).observe(
            time.perf_counter() - started
        )
        return response
