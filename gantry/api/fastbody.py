"""The runner's common bodies, read and written without building their DRF serializers (docs/performance.md).

Building a DRF serializer deep-copies every declared field, and validating or
rendering walks them all: on ready, accept and done that was 8% of the
lifecycle's Python samples, more than the routes' statements. These functions
handle exactly the shapes a well-behaved runner sends and receives (plain
strings, ints in range, nothing extra) and answer None for anything else, so
the caller hands that to the serializer as before: every refusal, its code
and its ``fields`` detail still come from DRF, and an accepted body yields the
same validated data DRF would give.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gantry.logs import live
from gantry.logs.limits import MAX_CHUNKS

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _plain_str(value: Any, max_length: int) -> bool:
    # What a DRF CharField returns unchanged: no surrounding whitespace to
    # trim, no NUL or surrogate (isprintable), within max_length.
    return type(value) is str and len(value) <= max_length and value == value.strip() and value.isprintable()


def _int_in(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high  # type(): a bool is not an int to DRF


# ReadySerializer's fields: max_length for strings, (low, high) for the nullable ints.
_READY_STR = {"hostname": 255, "launcher": 32, "container_id": 128, "pod_name": 253}
_READY_INT = {"pid": (0, INT32_MAX), "workflow_run_id": (0, INT64_MAX)}


def ready(data: Any) -> dict[str, Any] | None:
    """ReadySerializer's validated data for a plain body, or None: let the serializer judge it."""
    if type(data) is not dict:
        return None
    for key, value in data.items():
        if key in _READY_STR:
            if not _plain_str(value, _READY_STR[key]):
                return None
        elif key in _READY_INT:
            if value is not None and not _int_in(value, *_READY_INT[key]):
                return None
        else:
            return None  # DRF would drop it; the serializer can say so itself
    return dict(data)


_OUTCOMES = frozenset({"succeeded", "failure", "cancelled"})


def done(data: Any) -> dict[str, Any] | None:
    """DoneSerializer's validated data for a plain body, or None: let the serializer judge it."""
    if type(data) is not dict or type(data.get("outcome")) is not str or data["outcome"] not in _OUTCOMES:
        return None
    for key, value in data.items():
        if key == "outcome":
            continue
        if key == "exit_code":
            ok = value is None or _int_in(value, -INT32_MAX - 1, INT32_MAX)
        elif key == "sealed_chunks":
            ok = _int_in(value, 0, MAX_CHUNKS)
        elif key == "error":
            ok = _plain_str(value, 4000)
        elif key == "manifest":
            ok = _manifest_ok(value)
        else:
            ok = False
        if not ok:
            return None
    out = dict(data)
    if "manifest" in out:
        out["manifest"] = {"count": out["manifest"]["count"], "sha256": list(out["manifest"]["sha256"])}
    return out


def _manifest_ok(value: Any) -> bool:
    if type(value) is not dict or set(value) != {"count", "sha256"} or not _int_in(value["count"], 0, MAX_CHUNKS):
        return False
    hashes = value["sha256"]
    return type(hashes) is list and len(hashes) <= MAX_CHUNKS and all(_plain_str(h, 64) for h in hashes)


_LIVE_KEYS = frozenset({"chunk_index", "sealed_chunks", "data"})


def live_push(data: Any) -> dict[str, Any] | None:
    """LivePushSerializer's validated data (``data`` decoded to bytes) for a plain body, or None."""
    if type(data) is not dict or set(data) != _LIVE_KEYS:
        return None
    chunk, sealed, value = data["chunk_index"], data["sealed_chunks"], data["data"]
    if not (_int_in(chunk, 0, MAX_CHUNKS - 1) and _int_in(sealed, 0, MAX_CHUNKS) and sealed <= chunk):
        return None
    if type(value) is not str or not 0 < len(value) <= live.PUSH_DATA_MAX_LENGTH:
        return None
    try:
        raw = live.push_data(value)
    except ValueError:
        return None
    return {"chunk_index": chunk, "sealed_chunks": sealed, "data": raw}


def run_context(context: Mapping[str, Any]) -> dict[str, Any] | None:
    """RunContextSerializer(context).data for plain values, or None: let the serializer render it."""
    spec = _spec(context["spec"])
    secrets = context["secrets"]
    logs = context["logs"]
    plain = (
        spec is not None
        and _str_dict(secrets)
        and context["scm"] is None
        and type(logs) is dict
        and set(logs) == {"chunk_size_bytes", "seal_interval_s", "live_interval_s", "max_bytes"}
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
        "secrets": dict(secrets),
        "scm": None,
        "logs": {k: logs[k] for k in ("chunk_size_bytes", "seal_interval_s", "live_interval_s", "max_bytes")},
        "status_interval_s": context["status_interval_s"],
        "api_token": context["api_token"],
    }


def _str_dict(value: Any) -> bool:
    return type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items())


def _spec(spec: Any) -> dict[str, Any] | None:
    """SpecSerializer's rendering of a plain spec: steps of name and run, optional env and timeout_seconds."""
    if type(spec) is not dict or not set(spec) <= {"steps", "env", "timeout_seconds"} or "steps" not in spec:
        return None
    steps = spec["steps"]
    if type(steps) is not list or not all(
        type(s) is dict and set(s) == {"name", "run"} and type(s["name"]) is str and type(s["run"]) is str
        for s in steps
    ):
        return None
    out: dict[str, Any] = {"steps": [{"name": s["name"], "run": s["run"]} for s in steps]}
    if "env" in spec:
        if spec["env"] is not None and not _str_dict(spec["env"]):
            return None
        out["env"] = dict(spec["env"]) if spec["env"] is not None else None
    if "timeout_seconds" in spec:
        if spec["timeout_seconds"] is not None and type(spec["timeout_seconds"]) is not int:
            return None
        out["timeout_seconds"] = spec["timeout_seconds"]
    return out
