"""The runner-group and runner calls of the two-phase protocol (docs/design.md §4).

Group calls take the group JWT; runner calls take the runner JWT, and every
runner route checks the path against the token (the run binding): a token for
run X used on run Y, or for another runner, is refused with 403 and nothing
changes.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gantry import conf
from gantry.api.auth import IsRunner, IsRunnerGroup, RunnerPrincipal
from gantry.api.common import error_responses, group_of, runner_errors, runner_of, validated
from gantry.api.serializers import SpecSerializer, int_in, plain_str, str_dict
from gantry.core import params, services
from gantry.core.errors import BackendDispatchedGroup, NotFound
from gantry.core.models import GroupKind, RunStatus
from gantry.dispatch import claim as dispatch
from gantry.dispatch import coordinators, oidc
from gantry.dispatch.longpoll import wait_for_claim
from gantry.logs import live as live_logs
from gantry.logs.limits import MAX_CHUNKS
from gantry.reapers import reconcile
from gantry.server import asyncpoll
from gantry_wire.protocol import (
    COORDINATOR_HEADER_MAX,
    COORDINATOR_HOST_HEADER,
    COORDINATOR_ID_HEADER,
    COORDINATOR_VERSION_HEADER,
    RECONCILE_MAX_WORKERS,
)

# A reconcile report's bounds: workers per call, and an exited worker's last lines.
RECONCILE_MAX_LINES = 50
RECONCILE_MAX_LINE = 1000

# ---------------------------------------------------------------- runner group


class ClaimSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    runner_id = serializers.UUIDField()
    runner_token = serializers.CharField(help_text="The runner JWT; hand it to the ephemeral runner.")
    assigned_expires_at = serializers.DateTimeField(help_text="The runner must /accept before this.")

    @staticmethod
    def fast_represent(result: Any) -> dict[str, Any]:
        """The 200 body of a won claim (the view's, the fast lane's and the ASGI wake's alike).

        ClaimSerializer's representation without building the serializer (its
        field binding cost more than the rest of the poll's rendering): the ids
        as their UUIDFields render them, the deadline by the serializer's own
        bound field (DRF's format and time zone).
        """
        return {
            "run_id": str(result.run_id),
            "runner_id": str(result.runner_id),
            "runner_token": str(result.runner_token),
            "assigned_expires_at": _EXPIRES_AT.to_representation(result.assigned_expires_at),
        }


_EXPIRES_AT = ClaimSerializer().fields["assigned_expires_at"]


def counted_claims(group: Any) -> Any:
    """The threaded wait's attempts, counted as the ASGI path counts them (the first, then each after a wake)."""
    kinds = iter([asyncpoll.FIRST])

    def attempt() -> dispatch.Claim | None:
        asyncpoll.count_attempt(next(kinds, asyncpoll.WAKE))
        return dispatch.claim(group=group, raise_throttled=True)

    return attempt


def poll_wait(raw: str) -> float:
    """The poll's ``wait`` parameter in seconds; out of range or not a number: 400."""
    return params.wait_seconds(raw, maximum=min(30, conf.get().poll_max_wait))


class PollView(APIView):
    permission_classes = [IsRunnerGroup]

    @extend_schema(
        operation_id="runner_groups_poll",
        parameters=[
            OpenApiParameter(
                "wait",
                int,
                description="Seconds (0-30) to hold the request until work arrives (long poll). Default 0.",
            ),
            *(
                OpenApiParameter(
                    header,
                    str,
                    location=OpenApiParameter.HEADER,
                    required=False,
                    description=f"{what} (optional; 1-{COORDINATOR_HEADER_MAX[header]} visible ASCII characters, "
                    "no spaces). Shown on the group's page with the time of its last poll; a malformed value is "
                    "a 400 `invalid_request`.",
                )
                for header, what in (
                    (COORDINATOR_ID_HEADER, "The coordinator's instance id, one per process (a uuid4 at start)"),
                    (COORDINATOR_HOST_HEADER, "The coordinator's host name"),
                    (COORDINATOR_VERSION_HEADER, "The coordinator's version"),
                )
            ),
        ],
        responses={
            200: ClaimSerializer,
            204: OpenApiResponse(description="no claimable run (or the org's dispatch budget is spent)"),
            **runner_errors(400, 401, 403),
        },
        description="Claim the oldest pending run this group can serve: creates a not_ready stub runner, "
        "assigns the run to it with a lease and answers the runner's credentials. A github_actions group's "
        "token is refused (403 `backend_dispatched_group`): Gantry's backend dispatcher serves those groups.",
    )
    def get(self, request: Request) -> Response:
        group = group_of(request).group
        if group.kind == GroupKind.GITHUB_ACTIONS:
            # Its runs are claimed by Gantry's own dispatcher, under the per-org cap;
            # a coordinator polling it would go around both.
            raise BackendDispatchedGroup("a github_actions group is served by Gantry's backend dispatcher, not polled")
        wait = poll_wait(request.query_params.get("wait", "0"))
        # Which coordinator polls (optional headers; a malformed one is a 400 before anything is written).
        coordinators.record(group_id=group.id, who=coordinators.identity_of_meta(request.META))
        try:
            deferred = asyncpoll.deferred_of(request.META)
            if deferred is not None:
                # Under gantry.asgi: one attempt; the event loop parks the poll (no thread held).
                result = deferred.attempt(
                    group=group, wait=wait, claim=lambda: dispatch.claim(group=group, raise_throttled=True)
                )
            else:
                result = wait_for_claim(org_id=group.organization_id, wait=wait, attempt=counted_claims(group))
        except dispatch.Throttled:
            # The org's budget is spent: answer now rather than re-trying a
            # claim that would roll back again until the long poll's deadline.
            result = None
        if result is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(ClaimSerializer.fast_represent(result))


class DispatchFailedSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    runner_id = serializers.UUIDField()
    error = serializers.CharField(max_length=4000, help_text="Why the runner could not be started.")


class DispatchFailedView(APIView):
    permission_classes = [IsRunnerGroup]

    @extend_schema(
        operation_id="runner_groups_dispatch_failed",
        request=DispatchFailedSerializer,
        responses={204: None, **runner_errors(400, 401, 403, 404, 409)},
        description="The group could not start the runner for a claimed run: the run and its deployment fail "
        "(not re-queued: it would fail again), the stack's queue moves on, the stub runner is deleted and the "
        "error is recorded on the group (last_dispatch_error).",
    )
    def post(self, request: Request) -> Response:
        data = validated(DispatchFailedSerializer, request)
        services.dispatch_failed(group=group_of(request).group, **data)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WorkerReportSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    runner_id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=reconcile.WORKER_STATES)
    exit_code = serializers.IntegerField(
        required=False, allow_null=True, min_value=-(2**31), max_value=2**31 - 1,
        help_text="An exited worker's exit code; negative: killed by that signal; null: unknown.",
    )  # fmt: skip
    last_lines = serializers.ListField(
        child=serializers.CharField(max_length=RECONCILE_MAX_LINE, allow_blank=True, trim_whitespace=False),
        max_length=RECONCILE_MAX_LINES,
        required=False,
        help_text="An exited worker's last output lines (its runner's own log), oldest first.",
    )
    seconds = serializers.FloatField(required=False, allow_null=True, min_value=0, help_text="How long it ran.")


class ReconcileSerializer(serializers.Serializer):
    workers = serializers.ListField(child=WorkerReportSerializer(), max_length=RECONCILE_MAX_WORKERS)

    def validate_workers(self, workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for key in ("run_id", "runner_id"):
            seen = [w[key] for w in workers]
            if len(set(seen)) != len(seen):
                raise serializers.ValidationError(f"each worker must be listed once ({key} repeated)")
        return workers


class StopOrderSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    runner_id = serializers.UUIDField()
    reason = serializers.ChoiceField(
        choices=reconcile.STOP_REASONS,
        help_text="run_terminal: the run ended without this worker; lease_lapsed: it never accepted and now "
        "never can; runner_gone: its runner row was deleted.",
    )
    run_status = serializers.ChoiceField(choices=RunStatus.choices, allow_null=True)


class ReconcileRetrySerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    runner_id = serializers.UUIDField()


class ReconcileAnswerSerializer(serializers.Serializer):
    stop = StopOrderSerializer(many=True, help_text="Running workers to stop (the launcher's terminate).")
    retry = ReconcileRetrySerializer(many=True, help_text="Exited workers not settled yet: report them again.")


class ReconcileView(APIView):
    permission_classes = [IsRunnerGroup]

    @extend_schema(
        operation_id="runner_groups_reconcile",
        request=ReconcileSerializer,
        responses={200: ReconcileAnswerSerializer, **runner_errors(400, 401, 403)},
        description=(
            "The group reports the workers its launcher holds and gets back the ones to stop. An exited worker "
            "whose run is executing fails that run at once as runner lost (exit code and last lines in "
            "failure_reason), its live log becomes the final chunk, the stack's next run is promoted and the "
            "runner row deleted; one that exited before it accepted fails the run as a dispatch failure. A "
            "running worker is told to stop when its run ended, its lease lapsed, or its runner row is gone. "
            "Entries naming another group's runner, or a run not bound to that runner, are ignored. Idempotent."
        ),
    )
    def post(self, request: Request) -> Response:
        data = validated(ReconcileSerializer, request)
        reports = [reconcile.WorkerReport(**w) for w in data["workers"]]
        result = reconcile.group_reconcile(group=group_of(request).group, workers=reports)
        answer = {
            "stop": [dataclasses.asdict(order) for order in result.stop],
            "retry": [{"run_id": w.run_id, "runner_id": w.runner_id} for w in result.retry],
        }
        return Response(ReconcileAnswerSerializer(answer).data)


# ---------------------------------------------------------------- runner


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class ReadySerializer(serializers.Serializer):
    hostname = serializers.CharField(max_length=255, required=False, allow_blank=True)
    launcher = serializers.CharField(max_length=32, required=False, allow_blank=True)
    # Ranges are the columns' (integer, bigint): a larger number is a 400, never a database error.
    pid = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=INT32_MAX)
    container_id = serializers.CharField(max_length=128, required=False, allow_blank=True)
    pod_name = serializers.CharField(max_length=253, required=False, allow_blank=True)
    workflow_run_id = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=INT64_MAX)

    @staticmethod
    def fast_validate(data: Any) -> dict[str, Any] | None:
        """The validated data for a plain body (plain strings, ints in range or null, no other key), or None:
        let the serializer judge it."""
        if type(data) is not dict:
            return None
        for key, value in data.items():
            if key in _READY_STR:
                if not plain_str(value, _READY_STR[key]):
                    return None
            elif key in _READY_INT:
                if value is not None and not int_in(value, *_READY_INT[key]):
                    return None
            else:
                return None  # DRF would drop it; the serializer can say so itself
        return dict(data)


# ReadySerializer's fields: max_length of the strings, (low, high) of the nullable ints.
_READY_STR = {"hostname": 255, "launcher": 32, "container_id": 128, "pod_name": 253}
_READY_INT = {"pid": (0, INT32_MAX), "workflow_run_id": (0, INT64_MAX)}


class ReadyView(APIView):
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runners_ready",
        request=ReadySerializer,
        # 404: a path id that is not a uuid matches no route.
        responses={204: None, **runner_errors(400, 401, 403, 404, 409)},
        description="not_ready → ready, recording the runner's host metadata. Idempotent: a runner already "
        "ready gets 204 again (its first answer may have been lost). 409 runner_busy once it has accepted.",
    )
    def post(self, request: Request, runner_id: uuid.UUID) -> Response:
        principal = runner_of(request, runner_id=runner_id)
        data = ReadySerializer.fast_validate(request.data) or validated(ReadySerializer, request)
        services.runner_ready(runner_id=principal.runner.id, metadata=dict(data))
        return Response(status=status.HTTP_204_NO_CONTENT)


class LogsInfoSerializer(serializers.Serializer):
    chunk_size_bytes = serializers.IntegerField(help_text="Seal the active chunk once it holds this many bytes.")
    seal_interval_s = serializers.IntegerField(help_text="...or once it is this old, whichever comes first.")
    live_interval_s = serializers.IntegerField(help_text="Push the active chunk to logs/live this often.")
    max_bytes = serializers.IntegerField(help_text="Stop recording past this many bytes, with a truncation line.")


class RunContextSerializer(serializers.Serializer):
    run_id = serializers.UUIDField()
    deployment_id = serializers.IntegerField()
    stack_id = serializers.IntegerField()
    spec = SpecSerializer()
    secrets = serializers.DictField(child=serializers.CharField())
    scm = serializers.DictField(allow_null=True, help_text="Clone information; null when the stack has none.")
    logs = LogsInfoSerializer()
    status_interval_s = serializers.IntegerField()
    api_token = serializers.CharField(help_text="The run's API token. Shown once; the server keeps its hash only.")

    @staticmethod
    def fast_represent(context: Any) -> dict[str, Any] | None:
        """``RunContextSerializer(context).data`` for plain values (a plain spec, str secrets, no scm, int
        figures), or None: let the serializer render it."""
        spec = SpecSerializer.fast_represent(context["spec"])
        logs = context["logs"]
        plain = (
            spec is not None
            and str_dict(context["secrets"])
            and context["scm"] is None
            and type(logs) is dict
            and logs.keys() == _LOGS_KEYS
            and all(type(v) is int for v in logs.values())
            and type(context["deployment_id"]) is int
            and type(context["stack_id"]) is int
            and type(context["status_interval_s"]) is int
            and type(context["api_token"]) is str
        )
        if not plain:
            return None
        return {
            "run_id": str(context["run_id"]),
            "deployment_id": context["deployment_id"],
            "stack_id": context["stack_id"],
            "spec": spec,
            "secrets": dict(context["secrets"]),
            "scm": None,
            "logs": {k: logs[k] for k in ("chunk_size_bytes", "seal_interval_s", "live_interval_s", "max_bytes")},
            "status_interval_s": context["status_interval_s"],
            "api_token": context["api_token"],
        }


_LOGS_KEYS = frozenset({"chunk_size_bytes", "seal_interval_s", "live_interval_s", "max_bytes"})


class AcceptView(APIView):
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runs_accept",
        request=None,
        responses={200: RunContextSerializer, **runner_errors(401, 403, 404, 409)},
        description=(
            "assigned → running for the runner holding an unexpired lease; answers the RunContext. 409 codes: "
            "`accept_response_undeliverable` (this runner already accepted: the first answer was lost, so the run "
            "is failed now and may be retried), `run_already_terminal` (the run was discarded or cancelled while "
            "the runner booted: benign, exit 0). Otherwise an uncoded 409 (`conflict`) names the cause: pending "
            "(lease expired and reset), reassigned, lease past expiry, failure, startup_timeout."
        ),
    )
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = runner_of(request, run_id=run_id)
        run, api_token = services.run_accept(run_id=run_id, runner_id=principal.runner.id)
        return Response(accept_answer(run, api_token))


def accept_answer(run: Any, api_token: str) -> dict[str, Any]:
    """The 200 body of an accept: the RunContext (the view's and the fast lane's alike)."""
    context = services.run_context(run=run, api_token=api_token)
    return RunContextSerializer.fast_represent(context) or dict(RunContextSerializer(context).data)


class RunStatusSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=RunStatus.choices)
    cancel_requested = serializers.BooleanField()

    @staticmethod
    def fast_represent(run_status: str) -> dict[str, Any]:
        """The 200 body of /status for a run in ``run_status`` (the view's and the fast lane's alike)."""
        return {
            "status": run_status,
            "cancel_requested": run_status in (RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING),
        }


class StatusView(APIView):
    # The runner row is checked by the route's own statement (below), not by
    # a read of its own in BearerJWTAuthentication.
    runner_row_checked_by_route = True
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runs_status",
        responses={200: RunStatusSerializer, **runner_errors(401, 403, 404)},
        description="Refreshes the runner's liveness (last_seen_at) and answers the run's status and whether "
        "cancellation is requested. A terminal status means the runner should stop.",
    )
    def get(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = request.user
        assert isinstance(principal, RunnerPrincipal)
        # One round trip: the runner row's check (401 when gone, before the
        # binding's 403, as under the eager authentication), its liveness and
        # the run's status, in one prepared statement.
        found, run_status = services.runner_status(
            runner_id=principal.runner.id,
            runner_group_id=principal.runner.runner_group_id,
            run_id=run_id,
            bound=run_id == principal.run_id,
        )
        if not found:
            raise exceptions.AuthenticationFailed("runner no longer exists")
        runner_of(request, run_id=run_id)
        if run_status is None:
            raise NotFound("run not found")
        return Response(RunStatusSerializer.fast_represent(run_status))


class AcknowledgeCancelView(APIView):
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runs_acknowledging_cancel",
        request=None,
        responses={204: None, **runner_errors(401, 403, 404, 409)},
        description="requested_cancellation → cancelling: the runner is stopping its steps.",
    )
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = runner_of(request, run_id=run_id)
        services.run_acknowledge_cancel(run_id=run_id, runner_id=principal.runner.id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ManifestSerializer(serializers.Serializer):
    count = serializers.IntegerField(min_value=0, max_value=MAX_CHUNKS)
    sha256 = serializers.ListField(
        child=serializers.CharField(max_length=64), max_length=MAX_CHUNKS, help_text="Hash of each sealed chunk."
    )

    @staticmethod
    def fast_validate(value: Any) -> dict[str, Any] | None:
        """The validated data for a plain manifest (both keys, plain non-blank hashes), or None."""
        if type(value) is not dict or value.keys() != _MANIFEST_KEYS or not int_in(value["count"], 0, MAX_CHUNKS):
            return None
        hashes = value["sha256"]
        if type(hashes) is not list or len(hashes) > MAX_CHUNKS:
            return None
        if not all(plain_str(h, 64, allow_blank=False) for h in hashes):
            return None
        return {"count": value["count"], "sha256": list(hashes)}


_MANIFEST_KEYS = frozenset({"count", "sha256"})


OUTCOMES = ("succeeded", "failure", "cancelled")


class DoneSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=OUTCOMES)
    exit_code = serializers.IntegerField(required=False, allow_null=True, min_value=-INT32_MAX - 1, max_value=INT32_MAX)
    sealed_chunks = serializers.IntegerField(required=False, min_value=0, max_value=MAX_CHUNKS)
    manifest = ManifestSerializer(required=False)
    error = serializers.CharField(required=False, allow_blank=True, max_length=4000)

    @staticmethod
    def fast_validate(data: Any) -> dict[str, Any] | None:
        """The validated data for a plain body, or None: let the serializer judge it."""
        if type(data) is not dict or type(data.get("outcome")) is not str or data["outcome"] not in _OUTCOMES:
            return None
        out = dict(data)
        for key, value in data.items():
            if key == "outcome":
                continue
            if key == "exit_code":
                ok = value is None or int_in(value, -INT32_MAX - 1, INT32_MAX)
            elif key == "sealed_chunks":
                ok = int_in(value, 0, MAX_CHUNKS)
            elif key == "error":
                ok = plain_str(value, 4000)
            elif key == "manifest":
                manifest = ManifestSerializer.fast_validate(value)
                ok = manifest is not None
                out["manifest"] = manifest
            else:
                ok = False  # DRF would drop it; the serializer can say so itself
            if not ok:
                return None
        return out


_OUTCOMES = frozenset(OUTCOMES)


class DoneView(APIView):
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runs_done",
        request=DoneSerializer,
        responses={204: None, **runner_errors(400, 401, 403, 404, 409)},
        description="The run ends: succeeded, failure (with exit code) or cancelled (only after a cancellation "
        "request). The stack's next queued run is promoted and the run's API token revoked. `manifest` lists the "
        "sealed log chunks (count and sha256 of each); it must agree with `sealed_chunks` (400 otherwise). The "
        "run's live log record is deleted.",
    )
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = runner_of(request, run_id=run_id)
        data = DoneSerializer.fast_validate(request.data) or validated(DoneSerializer, request)
        services.run_finish(run_id=run_id, runner_id=principal.runner.id, **data)
        # After the run is settled: storage is now the whole log (the final
        # chunk was sealed before /done), and the reader uses the manifest,
        # so the record goes a moment later with others (as on the fast lane).
        live_logs.delete_soon(run_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeregisterView(APIView):
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runners_deregister",
        responses={204: None, **runner_errors(401, 403, 404, 409)},
        description="Delete the runner row (freeing its group slot and releasing any run it points at). "
        "409 runner_holds_run only while it holds a run: running, requested_cancellation, cancelling, or "
        "assigned with an unexpired lease. A runner whose run was skipped or whose lease lapsed may always go.",
    )
    def delete(self, request: Request, runner_id: uuid.UUID) -> Response:
        principal = runner_of(request, runner_id=runner_id)
        services.runner_deregister(runner_id=principal.runner.id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class OidcExchangeSerializer(serializers.Serializer):
    token = serializers.CharField(
        max_length=16384,
        help_text="The GitHub Actions OIDC token (a JWT) the workflow run asked for, with "
        "Gantry's audience (GANTRY_GITHUB_OIDC_AUDIENCE).",
    )
    correlation = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="The workflow's `correlation` input, when it has one (only where GitHub answered the dispatch "
        "without a workflow run id).",
    )


class RunnerTokenSerializer(serializers.Serializer):
    runner_token = serializers.CharField(
        help_text="The runner JWT; the ephemeral runner goes on as under any launcher (ready, accept, ...)."
    )


class OidcExchangeView(APIView):
    # The OIDC token in the body is the credential: no Gantry token exists yet.
    authentication_classes: list[type] = []
    permission_classes: list[type] = []

    @extend_schema(
        operation_id="runners_oidc_exchange",
        request=OidcExchangeSerializer,
        responses={
            200: RunnerTokenSerializer,
            **error_responses(
                400,
                401,
                403,
                404,
                texts={
                    401: "oidc_token_invalid: the token is malformed, signed with an unknown key, from another "
                    "issuer, for another audience, or expired",
                    403: "oidc_claims_mismatch: another repository, workflow or workflow run than this runner's "
                    "dispatch; oidc_exchange_used: already exchanged once",
                    404: "no such runner (its claim lapsed, or it was released)",
                },
            ),
        },
        auth=[],
        description="A github_actions workflow run exchanges its GitHub OIDC token for its runner token, once. "
        "The token must verify against the issuer's keys (GANTRY_GITHUB_OIDC_ISSUER), be for Gantry's audience "
        "and unexpired (else 401 `oidc_token_invalid`), and name the group's repository, the workflow file "
        "dispatched and the workflow run recorded at dispatch, or come with the one-time `correlation` value "
        "(else 403 `oidc_claims_mismatch`). A second exchange is 403 `oidc_exchange_used`. 404: no such runner "
        "(its claim lapsed). A refusal changes nothing.",
    )
    def post(self, request: Request, runner_id: uuid.UUID) -> Response:
        data = validated(OidcExchangeSerializer, request)
        claims = oidc.verify(data["token"])
        runner_token = services.github_runner_oidc_exchange(
            runner_id=runner_id, claims=claims, correlation=data.get("correlation", "")
        )
        return Response({"runner_token": runner_token})
