"""Django-level error pages: JSON in the contract's shape under /api/, Django's own elsewhere."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "not_found", "detail": "no such route or object"}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "server_error", "detail": "internal error; see the server log"}, status=500)
    return defaults.server_error(request)
