"""The log routes (docs/logs.md): the runner's live push and chunk handout, the local upload URL, and the reader."""

from __future__ import annotations

import uuid
from typing import Any

from django.core import signing
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gantry.api.auth import IsRunner
from gantry.api.common import ErrorSerializer, UserView, runner_errors, runner_of, scoped, user_errors, validated
from gantry.api.serializers import int_in
from gantry.core import params
from gantry.core.errors import InvalidRequest, UploadUrlInvalid
from gantry.core.models import Run
from gantry.logs import live, services
from gantry.logs.limits import CHUNK_GZIP_MAX, MAX_CHUNKS, PAGE_BYTES, TIME_MARKS_MAX
from gantry.logs.reader import read_log
from gantry.logs.storage import LocalStorage

TIMES_HELP = (
    f"Optional: the chunk's time marks, at most {TIME_MARKS_MAX} [offset in the chunk, epoch ms] pairs of "
    "integers, offsets strictly increasing from 0: each line's time is that of the mark at or before its first "
    "byte. Kept beside the chunk; the log's bytes do not change."
)


TIME_MARKS_SCHEMA = {
    "type": "array",
    "nullable": True,
    "maxItems": TIME_MARKS_MAX,
    "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
}


@extend_schema_field(TIME_MARKS_SCHEMA)
class TimeMarksField(serializers.JSONField):
    """``times``: [[offset, ms], ...] checked by ``live.time_marks`` (the fast paths use the same check)."""

    def to_internal_value(self, data: Any) -> Any:
        try:
            return live.time_marks(super().to_internal_value(data))
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class LivePushSerializer(serializers.Serializer):
    chunk_index = serializers.IntegerField(min_value=0, max_value=MAX_CHUNKS - 1, help_text="The active chunk.")
    sealed_chunks = serializers.IntegerField(
        min_value=0, max_value=MAX_CHUNKS, help_text="Chunks durably uploaded (advanced only after a successful PUT)."
    )
    # DRF's metaclass moves declared fields off the class, so this does not
    # shadow Serializer.data at runtime; only the stubs see a clash.
    data = serializers.CharField(  # type: ignore[assignment]
        allow_blank=False,
        trim_whitespace=False,
        max_length=live.PUSH_DATA_MAX_LENGTH,
        help_text=f"Base64 of the gzip of the active chunk's bytes; at most {CHUNK_GZIP_MAX} bytes of gzip.",
    )
    times = TimeMarksField(required=False, allow_null=True, help_text=TIMES_HELP)

    def validate_data(self, value: str) -> bytes:
        try:
            return live.push_data(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["sealed_chunks"] > attrs["chunk_index"]:
            raise serializers.ValidationError("sealed_chunks cannot exceed chunk_index: the active chunk is not sealed")
        return attrs

    @staticmethod
    def fast_validate(data: Any) -> dict[str, Any] | None:
        """The validated data (``data`` decoded to bytes) for a plain push (the three keys, ints in range), or
        None: let the serializer judge it (gantry.api.serializers, "fast paths")."""
        if type(data) is not dict or (data.keys() != _LIVE_KEYS and data.keys() != _LIVE_TIMED_KEYS):
            return None
        chunk, sealed, value = data["chunk_index"], data["sealed_chunks"], data["data"]
        if not (int_in(chunk, 0, MAX_CHUNKS - 1) and int_in(sealed, 0, MAX_CHUNKS) and sealed <= chunk):
            return None
        if type(value) is not str or not 0 < len(value) <= live.PUSH_DATA_MAX_LENGTH:
            return None
        try:
            raw = live.push_data(value)
        except ValueError:
            return None
        answer = {"chunk_index": chunk, "sealed_chunks": sealed, "data": raw}
        if "times" in data:
            try:
                answer["times"] = live.time_marks(data["times"])
            except ValueError:
                return None
        return answer


_LIVE_KEYS = frozenset({"chunk_index", "sealed_chunks", "data"})
_LIVE_TIMED_KEYS = _LIVE_KEYS | {"times"}


class LiveLogView(APIView):
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runs_logs_live",
        request=LivePushSerializer,
        responses={
            204: OpenApiResponse(description="accepted, or dropped (no Redis; the run no longer executes here)"),
            # 404: a path id that is not a uuid matches no route.
            **runner_errors(400, 401, 403, 404),
        },
        description="Replace the run's live log record (a snapshot of its active chunk). Best-effort: 204 for "
        "every well-formed push, also when Redis is unavailable or the run is no longer executing on this runner "
        "(the push is then dropped). 400 for a malformed one.",
    )
    def post(self, request: Request, run_id: uuid.UUID) -> Response:
        principal = runner_of(request, run_id=run_id)
        data = LivePushSerializer.fast_validate(request.data) or validated(LivePushSerializer, request)
        services.live_push(run_id=run_id, runner_id=principal.runner.id, **data)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ChunkRequestSerializer(serializers.Serializer):
    sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", help_text="Hex sha256 of the chunk's gzip bytes.")
    size = serializers.IntegerField(min_value=1, max_value=CHUNK_GZIP_MAX, help_text="Byte count of the gzip.")
    times = TimeMarksField(required=False, allow_null=True, help_text=TIMES_HELP)


class PresignedPutSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="PUT the gzip bytes here (absolute URL).")
    method = serializers.CharField()
    headers = serializers.DictField(child=serializers.CharField(), help_text="Send exactly these headers with the PUT.")
    expires_at = serializers.DateTimeField()


class ChunkUploadUrlView(APIView):
    permission_classes = [IsRunner]

    @extend_schema(
        operation_id="runs_logs_chunk_upload_url",
        request=ChunkRequestSerializer,
        responses={200: PresignedPutSerializer, **runner_errors(400, 401, 403, 404, 409)},
        description=f"A presigned PUT for sealed chunk n (0 ≤ n < {MAX_CHUNKS}): S3 when configured, else Gantry's "
        "own signed upload URL. Storage keeps the chunk only if the body has this size and sha256, and only once. "
        "409 `run_terminal` once the run has finished; 409 `conflict` when the run is not executing on this runner.",
    )
    def post(self, request: Request, run_id: uuid.UUID, n: int) -> Response:
        principal = runner_of(request, run_id=run_id)
        data = validated(ChunkRequestSerializer, request)
        put = services.chunk_upload_url(run_id=run_id, runner_id=principal.runner.id, n=n, **data)
        answer = put.as_dict()
        answer["url"] = request.build_absolute_uri(put.url)  # Gantry's own URL is a path; S3's is absolute
        return Response(PresignedPutSerializer(answer).data)


class RawParser(BaseParser):
    """Documents the body; the view reads the raw stream itself."""

    media_type = "*/*"


class LogUploadView(APIView):
    # The signed URL is the credential (like an S3 presigned URL): no header auth.
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    parser_classes = [RawParser]

    @extend_schema(
        operation_id="log_uploads_put",
        request={"application/gzip": OpenApiTypes.BINARY},
        responses={
            201: OpenApiResponse(description="stored"),
            200: OpenApiResponse(description="already stored with identical content (a retried upload)"),
            400: OpenApiResponse(ErrorSerializer, description="size or sha256 differ from the URL's"),
            401: OpenApiResponse(ErrorSerializer, description="`upload_url_invalid`: forged or expired URL"),
            404: OpenApiResponse(ErrorSerializer, description="this server stores chunks in S3"),
            409: OpenApiResponse(ErrorSerializer, description="`chunk_exists`: stored with other content"),
        },
        description="Gantry's own signed upload URL for a sealed chunk, handed out by "
        "`POST /runs/{run_id}/logs/chunks/{n}` when no S3 bucket is configured. Checks the body's size and sha256 "
        "and writes the chunk once.",
    )
    def put(self, request: Request, token: str) -> Response:
        try:
            grant = LocalStorage.verify_upload_token(token)
        except signing.SignatureExpired:
            raise UploadUrlInvalid("this upload URL has expired; ask for a new one") from None
        except signing.BadSignature:
            raise UploadUrlInvalid("this upload URL is not valid") from None
        # Read the stream, not request.body: bounded by the grant, not by
        # DATA_UPLOAD_MAX_MEMORY_SIZE, and one byte more reveals an oversize body.
        data = request._request.read(grant.size + 1)
        result = services.chunk_store_upload(grant=grant, data=data)
        return Response(status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)


class LogPageSerializer(serializers.Serializer):
    text = serializers.CharField(help_text="The log from `offset`, decoded as UTF-8 (invalid bytes as U+FFFD).")
    next_offset = serializers.IntegerField(help_text="Ask again from here to follow the log.")
    complete = serializers.BooleanField(
        help_text="The run has finished and the log is known whole: it ends at next_offset."
    )
    final = serializers.BooleanField(
        help_text="The run has finished and nothing will be added after next_offset (stop following). "
        "Final but not complete: output was lost, and the text ends with a [gantry: ...] line saying so."
    )
    times = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        required=False,
        help_text="Only with ?times=1: [byte offset into the log, epoch ms] marks for this page's bytes, ascending, "
        "plus the last mark before `offset`; a line's time is that of the mark at or before its first byte. "
        "Empty where the runner recorded no times (an older runner, the server's own marker lines).",
    )


def log_wait(raw: str) -> float:
    """The log read's ``wait`` in seconds; not a number from 0 to WAIT_MAX: 400."""
    return params.wait_seconds(raw, maximum=live.WAIT_MAX)


class RunLogView(UserView):
    @extend_schema(
        operation_id="runs_logs_read",
        parameters=[
            OpenApiParameter(
                "offset", int, description="Byte offset into the log to read from: 0, or a previous next_offset."
            ),
            OpenApiParameter(
                "times", int, enum=[0, 1], description="1: also answer `times`, the page's per-line time marks."
            ),
            OpenApiParameter(
                "wait",
                float,
                description=f"Seconds, 0 to {live.WAIT_MAX} (default 0): when nothing past `offset` exists yet and "
                "the run is not final, hold the answer until the runner pushes new output or the run ends, at most "
                "this long, then answer as usual (a long poll). Served by the production server (gantry.asgi); "
                "other servers answer at once.",
            ),
        ],
        responses={200: LogPageSerializer, **user_errors(400, 401, 403, 404)},
        description=f"The run's log from `offset`: sealed chunks in order (gap markers for missing or corrupt "
        f"ones), then the live chunk of an active run; at most {PAGE_BYTES} bytes per answer. Loop with "
        "`offset = next_offset` until `final` (`complete` when the log is known whole).",
    )
    def get(self, request: Request, pk: uuid.UUID) -> Response:
        run = scoped(request, Run.objects.all(), pk, org_path="organization")
        raw = request.query_params.get("offset", "0")
        try:
            offset = int(raw)
        except ValueError:
            raise InvalidRequest("offset must be a whole number of bytes") from None
        if offset < 0:
            raise InvalidRequest("offset must not be negative")
        want_times = request.query_params.get("times", "0")
        if want_times not in ("0", "1"):
            raise InvalidRequest("times must be 0 or 1")
        wait = log_wait(request.query_params.get("wait", "0"))
        page = read_log(run, offset=offset, times=want_times == "1")
        park = request._request.META.get(live.PARK_ENVIRON_KEY)
        if wait > 0 and isinstance(park, live.Park) and page.next_offset == offset and not page.final:
            park.wait = wait  # gantry.server.asgi holds this answer and asks again on a push (logwait)
        answer: dict[str, Any] = {
            "text": page.text, "next_offset": page.next_offset, "complete": page.complete, "final": page.final
        }  # fmt: skip
        if page.times is not None:
            answer["times"] = page.times
        return Response(LogPageSerializer(answer).data)
