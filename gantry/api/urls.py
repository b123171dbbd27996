"""The routes under /api/v1 (the contract: schema/openapi.yaml, docs/api.md, docs/protocol.md)."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from gantry.api import budget_views as bv
from gantry.api import queue_views as qv
from gantry.api import runner_admin_views as rav
from gantry.api import runner_views as rv
from gantry.api import views as v
from gantry.api import webhook_views as wv
from gantry.logs import views as lv

urlpatterns = [
    # The two-phase protocol: runner-group and runner calls. First: they are
    # most of the traffic, and Django tries the patterns in order.
    path("runner-groups/poll", rv.PollView.as_view()),
    path("runner-groups/dispatch-failed", rv.DispatchFailedView.as_view()),
    path("runner-groups/reconcile", rv.ReconcileView.as_view()),
    path("runner-groups/demand", qv.DemandView.as_view()),
    path("runners/<uuid:runner_id>/ready", rv.ReadyView.as_view()),
    path("runners/<uuid:runner_id>/deregister", rv.DeregisterView.as_view()),
    path("runners/<uuid:runner_id>/oidc-exchange", rv.OidcExchangeView.as_view()),
    path("runs/<uuid:run_id>/accept", rv.AcceptView.as_view()),
    path("runs/<uuid:run_id>/status", rv.StatusView.as_view()),
    path("runs/<uuid:run_id>/acknowledging-cancel", rv.AcknowledgeCancelView.as_view()),
    path("runs/<uuid:run_id>/done", rv.DoneView.as_view()),
    # Logs: the runner's live push and chunk handout, and Gantry's own upload URL (no S3).
    path("runs/<uuid:run_id>/logs/live", lv.LiveLogView.as_view()),
    path("runs/<uuid:run_id>/logs/chunks/<int:n>", lv.ChunkUploadUrlView.as_view()),
    path("log-uploads/<str:token>", lv.LogUploadView.as_view(), name="log_upload"),
    path("schema", SpectacularAPIView.as_view(permission_classes=[], authentication_classes=[]), name="schema"),
    path("orgs", v.OrgListView.as_view()),
    path("orgs/<slug:org>", v.OrgDetailView.as_view()),
    path("orgs/<slug:org>/members", v.MemberListView.as_view()),
    path("orgs/<slug:org>/members/<str:username>/password-link", v.MemberPasswordLinkView.as_view()),
    path("invitations", v.InvitationListView.as_view()),
    path("invitations/<int:pk>/accept", v.InvitationAcceptView.as_view()),
    path("invitations/<int:pk>/decline", v.InvitationDeclineView.as_view()),
    path("orgs/<slug:org>/runner-groups", v.RunnerGroupListView.as_view()),
    path("orgs/<slug:org>/stacks", v.StackListView.as_view()),
    path("orgs/<slug:org>/runs-per-hour-limit", v.RunsPerHourLimitView.as_view()),
    path("orgs/<slug:org>/dispatch-budget", bv.DispatchBudgetView.as_view()),
    path("orgs/<slug:org>/queue", qv.QueueView.as_view()),
    path("orgs/<slug:org>/runs", qv.RunListView.as_view()),
    path("orgs/<slug:org>/webhooks", wv.WebhookListView.as_view()),
    path("webhooks/<int:pk>", wv.WebhookDetailView.as_view()),
    path("webhooks/<int:pk>/deliveries", wv.WebhookDeliveryListView.as_view()),
    # User and admin calls.
    path("runner-groups/<int:pk>", v.RunnerGroupDetailView.as_view()),
    path("runner-groups/<int:pk>/rotate-token", v.RunnerGroupRotateTokenView.as_view()),
    path("runner-groups/<int:pk>/drain", v.RunnerGroupDrainView.as_view(), name="runner_groups_drain"),
    path("runner-groups/<int:pk>/undrain", v.RunnerGroupUndrainView.as_view(), name="runner_groups_undrain"),
    path("runner-groups/<int:pk>/runners", rav.RunnerGroupRunnersView.as_view()),
    path("runners/<uuid:runner_id>/force-delete", rav.RunnerForceDeleteView.as_view()),
    path("stacks/<int:pk>", v.StackDetailView.as_view()),
    path("stacks/<int:pk>/deployments", v.DeploymentListView.as_view()),
    path("deployments/<int:pk>", v.DeploymentDetailView.as_view()),
    path("deployments/<int:pk>/skip", v.DeploymentSkipView.as_view()),
    path("deployments/<int:pk>/retry", v.DeploymentRetryView.as_view()),
    path("runs/<uuid:pk>", v.RunDetailView.as_view()),
    path("runs/<uuid:pk>/cancel", v.RunCancelView.as_view()),
    path("runs/<uuid:pk>/logs", lv.RunLogView.as_view()),
    path("orgs/<slug:org>/members/<str:username>", v.MemberDetailView.as_view()),
]
