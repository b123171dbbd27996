"""Django-level error pages: JSON in the contract's shape under /api/, the site's own styled pages elsewhere.

The 403 (a refused role, or a form whose CSRF token failed) and 404 pages
keep the nav (the user's landing org's links), so a wrong URL is a step back,
not a dead end. The 500 page is rendered without
the request and without the database: it must still answer when the
database is what failed (no context processors, no user, no org).
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse
from django.template import loader

log = logging.getLogger(__name__)

# The last resort if even the 500 template cannot render (a broken template or a missing static manifest).
_BARE_500 = "<!doctype html><title>Server error · Gantry</title><h1>Server error</h1><p>See the server log.</p>"


def _page(request: HttpRequest, template: str, status: int, detail: str) -> HttpResponse:
    from gantry.web.pages import frame_context  # pages imports the models: not at Django's URL-conf load

    try:
        frame = frame_context(request)
    except Exception:  # the nav is a courtesy; the error page must answer without it
        log.exception("error page: the nav could not be built")
        frame = {}
    html = loader.render_to_string(template, {**frame, "detail": detail, "request_path": request.path}, request)
    return HttpResponse(html, status=status)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "invalid_request", "detail": "bad request"}, status=400)
    return _page(request, "400.html", 400, "The request could not be read.")


def forbidden(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "forbidden", "detail": str(exception) or "forbidden"}, status=403)
    # A PermissionDenied raised with a sentence says what role it needs; show it.
    return _page(request, "403.html", 403, str(exception) or "")


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a refused form post says what happened and that nothing changed, in the site's style.

    Django's reason (e.g. "CSRF token missing") goes to the log, not the page.
    """
    log.warning("CSRF refused %s %s: %s", request.method, request.path, reason)
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "forbidden", "detail": f"CSRF check failed: {reason}"}, status=403)
    return _page(request, "403_csrf.html", 403, "")


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "not_found", "detail": "no such route or object"}, status=404)
    return _page(request, "404.html", 404, "")


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "server_error", "detail": "internal error; see the server log"}, status=500)
    try:
        return HttpResponseServerError(loader.get_template("500.html").render({}))
    except Exception:
        log.exception("the 500 page could not render")
        return HttpResponseServerError(_BARE_500)
