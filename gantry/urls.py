from django.contrib import admin
from django.urls import include, path

from gantry.web import ops

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("gantry.api.urls")),
    path("healthz", ops.healthz),
    path("readyz", ops.readyz),
    path("metrics", ops.metrics),
    # The pages: the queue, runs, runner groups, login (gantry/web/urls.py).
    path("", include("gantry.web.urls")),
]

# JSON errors for API paths that match no route (or crash), in the contract's shape.
handler404 = "gantry.web.errors.not_found"
handler500 = "gantry.web.errors.server_error"
