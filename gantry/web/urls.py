"""The pages (``gantry.web.pages``, ``gantry.web.accounts``); the site root leads to the user's queue."""

from django.urls import path

from gantry.web import accounts, pages

app_name = "web"

urlpatterns = [
    path("", pages.home, name="home"),
    path("login", accounts.login, name="login"),
    path("logout", accounts.logout, name="logout"),
    path("set-password/<uidb64>/<token>", accounts.set_password, name="set_password"),
    path("invitations", accounts.invitations, name="invitations"),
    path("invitations/<int:pk>/<str:answer>", accounts.invitation_answer, name="invitation_answer"),
    path("orgs/<slug:org>/queue", pages.queue_page, name="queue"),
    path("orgs/<slug:org>/rate", pages.set_rate, name="set_rate"),
    path("orgs/<slug:org>/runner-groups", pages.groups_page, name="groups"),
    path("runner-groups/<int:pk>/<str:action>", pages.group_action, name="group_action"),
    path("runs/<uuid:pk>", pages.run_page, name="run"),
    path("runs/<uuid:pk>/<str:action>", pages.run_action, name="run_action"),
    path("runs/<uuid:pk>/log/raw", pages.run_log_download, name="run_log_raw"),
]
