"""The pages (``gantry.web.pages``, ``gantry.web.accounts``); the site root leads to the user's queue."""

from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import path

from gantry.web import accounts, group_pages, member_pages, pages, stack_pages, webhook_pages

app_name = "web"


def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    # Resolved per request, not at URL-conf load: the static storage may hash the name.
    return HttpResponsePermanentRedirect(static("web/favicon.svg"))


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
    # Before the generic run action route, which would take "run-again" or "priority" as an action.
    path("runs/<uuid:pk>/run-again", stack_pages.run_again, name="run_again"),
    path("runs/<uuid:pk>/priority", pages.run_priority, name="run_priority"),
    path("runs/<uuid:pk>/<str:action>", pages.run_action, name="run_action"),
    # Browsers ask for /favicon.ico whatever the page's <link rel=icon> says: send them to the SVG.
    path("favicon.ico", favicon, name="favicon"),
    path("runs/<uuid:pk>/log/raw", pages.run_log_download, name="run_log_raw"),
    path("orgs/<slug:org>/members", member_pages.members_page, name="members"),
    path("orgs/<slug:org>/webhooks", webhook_pages.webhooks_page, name="webhooks"),
    path("orgs/<slug:org>/webhooks/add", webhook_pages.webhook_add, name="webhook_add"),
    path("orgs/<slug:org>/webhooks/<int:pk>/delete", webhook_pages.webhook_delete, name="webhook_delete"),
    path("orgs/<slug:org>/members/invite", member_pages.member_invite, name="member_invite"),
    path("orgs/<slug:org>/members/<str:username>/<str:action>", member_pages.member_action, name="member_action"),
    path("account", member_pages.account_page, name="account"),
    path("account/token", member_pages.account_token, name="account_token"),
    path("account/password", member_pages.password_change, name="password_change"),
    path("orgs/<slug:org>/stacks", stack_pages.stacks_page, name="stacks"),
    path("stacks/<int:pk>", stack_pages.stack_page, name="stack"),
    path("stacks/<int:pk>/deploy", stack_pages.deploy, name="stack_deploy"),
    path("stacks/<int:pk>/archive", stack_pages.archive, name="stack_archive"),
    path("stacks/<int:pk>/default-priority", stack_pages.set_default_priority, name="stack_default_priority"),
    path("runner-groups/<int:pk>", group_pages.group_page, name="group"),
    path("orgs/<slug:org>/runner-groups/new", group_pages.group_create, name="group_create"),
    path(
        "runner-groups/<int:pk>/runners/<uuid:runner_id>/force-delete",
        group_pages.runner_force_delete,
        name="group_runner_force_delete",
    ),
]
