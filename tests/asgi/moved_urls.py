"""A URL configuration in which the hot routes moved (tests/asgi/test_lane_facts.py): status elsewhere, accept
routed twice, ready gone, done shadowed by an earlier pattern."""

from django.http import HttpResponse
from django.urls import include, path

from gantry.api import runner_views as rv
from gantry.logs import views as lv


def shadow(request: object, **kwargs: object) -> HttpResponse:
    return HttpResponse(status=418)


api = [
    path("beats/<uuid:run_id>/heartbeat", rv.StatusView.as_view()),
    path("runs/<uuid:run_id>/accept", rv.AcceptView.as_view()),
    path("runs/<uuid:run_id>/accept-again", rv.AcceptView.as_view()),
    path("runs/<uuid:run_id>/done", shadow),
    path("runs/<uuid:run_id>/done", rv.DoneView.as_view()),
    path("runs/<uuid:run_id>/logs/live", lv.LiveLogView.as_view()),
    path("runners/<str:runner_id>/deregister", rv.DeregisterView.as_view()),
    path("runner-groups/poll", rv.PollView.as_view()),
]
urlpatterns = [path("v2/", include(api))]
