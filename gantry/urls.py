"""The site's routes: the API, the admin, the pages, the ops endpoints, the runner's one-file client."""

from django.contrib import admin
from django.urls import include, path

from gantry.web import ops, runner_client

urlpatterns = [
    # The API first: Django tries patterns in order, and a path that misses
    # the admin's include costs a walk over all of the admin's patterns (the
    # runner calls are most of the traffic; docs/performance.md).
    path("api/v1/", include("gantry.api.urls")),
    path("admin/", admin.site.urls),
    path("healthz", ops.healthz),
    path("readyz", ops.readyz),
    path("metrics", ops.metrics),
    # The pages: the queue, runs, runner groups, login (gantry/web/urls.py).
    path("", include("gantry.web.urls")),
    # The client side as one file, for jobs that have only Python and curl (docs/github-actions.md).
    path("runner/gantry-runner.pyz", runner_client.latest),
    path("runner/gantry-runner-<str:version>.pyz", runner_client.versioned),
]

# JSON errors for API paths that match no route (or crash), in the contract's shape; styled pages elsewhere.
handler400 = "gantry.web.errors.bad_request"
handler403 = "gantry.web.errors.forbidden"
handler404 = "gantry.web.errors.not_found"
handler500 = "gantry.web.errors.server_error"
