"""Each serializer's fast path (``fast_validate``, ``fast_represent``) against the serializer itself.

The runner's hot calls read and write their bodies without building their
serializers (gantry.api.serializers, "fast paths"). A fast reader may hand
any body back (None: the serializer judges it), but whatever it accepts the
serializer must accept too, with equal validated data; whatever the
serializer refuses, the fast reader must hand back. A fast writer must render
the bytes the serializer renders, for every value it does not hand back.
Checked on generated bodies, plain and hostile (extra keys, wrong types,
bools for ints, out-of-range ints, padded strings, NUL, lone surrogates,
over-long strings, nested values), and on the examples that once mattered.
"""

from __future__ import annotations

import base64
import gzip
import string
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from gantry.api.runner_views import (
    INT32_MAX,
    INT64_MAX,
    OUTCOMES,
    ClaimSerializer,
    DoneSerializer,
    ReadySerializer,
    RunContextSerializer,
    RunStatusSerializer,
)
from gantry.core.models import RunStatus
from gantry.dispatch.claim import Claim
from gantry.logs.limits import MAX_CHUNKS
from gantry.logs.views import LivePushSerializer

Reader = Callable[[Any], dict[str, Any] | None]
GENERATED = settings(max_examples=500, deadline=None)


def plain(value: Any) -> Any:
    """DRF's OrderedDicts and ReturnDicts as plain dicts and lists, for equality."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def assert_reads_as(serializer: type[serializers.Serializer], fast: Reader, body: Any) -> dict[str, Any] | None:
    """The property: fast accepts ⇒ the serializer accepts, with equal data; the serializer refuses ⇒ fast hands
    back. Answers what fast read."""
    got = fast(body)
    checked = serializer(data=body)
    # As gantry.api.common.validated: a body that is not an object is refused before its fields.
    valid = isinstance(body, dict) and checked.is_valid()
    if got is not None:
        assert valid, (body, checked.errors)
        assert plain(got) == plain(dict(checked.validated_data))
    if not valid:
        assert got is None
    return got


def render(value: Any) -> bytes:
    return JSONRenderer().render(value)


# ---------------------------------------------------------------- values, plain and hostile

_SAFE = string.ascii_letters + string.digits + "-._:/"


def plain_text(max_size: int, *, min_size: int = 0) -> st.SearchStrategy[str]:
    return st.text(alphabet=_SAFE, min_size=min_size, max_size=max_size)


def hostile_text(max_length: int) -> st.SearchStrategy[str]:
    """Strings around a CharField's max_length, and every kind DRF trims, refuses or coerces."""
    return st.one_of(
        plain_text(8),
        st.text(max_size=12),
        plain_text(6).map(lambda s: f" {s} "),
        plain_text(6).map(lambda s: f"{s}\t"),
        plain_text(6).map(lambda s: f"{s}\x00"),
        plain_text(6).map(lambda s: f"\ud800{s}"),
        st.integers(max_length - 1, max_length + 1).map(lambda n: "x" * n),
        st.sampled_from(["", " ", "\n", "\u00a0", "two\nlines", "é", "\u2028", "a\udfffb"]),
    )


def ints(low: int, high: int) -> st.SearchStrategy[Any]:
    """Ints in and just out of [low, high], bools, and ints in other clothes (floats, strings)."""
    edges = [low - 1, low, low + 1, high - 1, high, high + 1, 0, -1, 2**31, 2**63, -(2**63) - 1]
    return st.one_of(
        st.integers(low, min(high, low + 1000)),
        st.sampled_from(edges),
        st.integers(),
        st.booleans(),
        st.sampled_from([1.0, 0.5, "12", " 7 ", "1e3", float("inf")]),
    )


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=6))
nested = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                               max_size=3),
                      max_leaves=8)  # fmt: skip


def bodies(
    plain_bodies: st.SearchStrategy[dict[str, Any]],
    fields: dict[str, st.SearchStrategy[Any]],
    required: tuple[str, ...] = (),
) -> st.SearchStrategy[Any]:
    """Plain bodies; plain bodies with one or two fields (or an extra key) made hostile, so that one fault is
    not hidden behind another; objects of any fields, each plain or hostile; and now and then not an object."""
    hostile = {**fields, "extra": nested, "": scalars}
    fault = st.sampled_from(sorted(hostile)).flatmap(lambda key: st.tuples(st.just(key), hostile[key]))

    def apply(body: dict[str, Any], faults: list[tuple[str, Any]]) -> dict[str, Any]:
        return {**body, **dict(faults)}

    anything = st.fixed_dictionaries(
        {key: fields[key] for key in required},
        optional={**{key: value for key, value in fields.items() if key not in required}, "extra": nested},
    )  # fmt: skip
    return st.one_of(
        plain_bodies,
        st.builds(apply, plain_bodies, st.lists(fault, min_size=1, max_size=1)),
        st.builds(apply, plain_bodies, st.lists(fault, min_size=1, max_size=1)),
        st.builds(apply, plain_bodies, st.lists(fault, min_size=2, max_size=2)),
        plain_bodies.map(lambda body: {key: value for key, value in body.items() if key not in required[:1]}),
        anything,
        nested,
    )


# ---------------------------------------------------------------- ready


READY_FIELDS = {
    "hostname": st.one_of(plain_text(255), hostile_text(255)),
    "launcher": st.one_of(plain_text(32), hostile_text(32)),
    "container_id": st.one_of(plain_text(128), hostile_text(128)),
    "pod_name": st.one_of(plain_text(253), hostile_text(253)),
    "pid": st.one_of(st.none(), ints(0, INT32_MAX)),
    "workflow_run_id": st.one_of(st.none(), ints(0, INT64_MAX)),
}
PLAIN_READY = st.fixed_dictionaries(
    {},
    optional={
        "hostname": plain_text(255).filter(str.strip),
        "launcher": plain_text(32),
        "pid": st.one_of(st.none(), st.integers(0, INT32_MAX)),
        "workflow_run_id": st.one_of(st.none(), st.integers(0, INT64_MAX)),
    },
)

READY_EXAMPLES: list[Any] = [
    {},
    {"hostname": "h", "launcher": "local", "pid": 12, "container_id": "", "pod_name": "p", "workflow_run_id": None},
    {"hostname": " padded "},
    {"hostname": "x" * 256},
    {"hostname": "nul\x00"},
    {"hostname": 5},
    {"pid": True},
    {"pid": -1},
    {"pid": 2**31},
    {"pid": "12"},
    {"workflow_run_id": 2**63},
    {"other": 1},
    ["not", "an", "object"],
]


@GENERATED
@given(bodies(PLAIN_READY, READY_FIELDS))
def test_it_reads_a_ready_body_as_its_serializer_would(body: Any) -> None:
    assert_reads_as(ReadySerializer, ReadySerializer.fast_validate, body)


@pytest.mark.parametrize("body", READY_EXAMPLES)
def test_it_reads_the_ready_examples_as_its_serializer_would(body: Any) -> None:
    assert_reads_as(ReadySerializer, ReadySerializer.fast_validate, body)


@settings(deadline=None)
@given(PLAIN_READY)
def test_it_reads_every_plain_ready_body_itself(body: dict[str, Any]) -> None:
    assert assert_reads_as(ReadySerializer, ReadySerializer.fast_validate, body) is not None


# ---------------------------------------------------------------- done


HASH = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
MANIFESTS = st.one_of(
    st.builds(lambda hashes: {"count": len(hashes), "sha256": hashes}, st.lists(HASH, max_size=3)),
    st.lists(st.one_of(HASH, hostile_text(64)), min_size=1, max_size=3).map(lambda h: {"count": len(h), "sha256": h}),
    st.fixed_dictionaries(
        {},
        optional={
            "count": ints(0, MAX_CHUNKS),
            "sha256": st.one_of(st.lists(st.one_of(HASH, hostile_text(64)), max_size=3), nested),
        },
    ),
    st.lists(HASH, max_size=2).map(lambda hashes: {"count": 1, "sha256": hashes, "extra": True}),
)
DONE_FIELDS = {
    "outcome": st.one_of(st.sampled_from(OUTCOMES), hostile_text(10), st.sampled_from(OUTCOMES).map(str.upper)),
    "exit_code": st.one_of(st.none(), ints(-INT32_MAX - 1, INT32_MAX)),
    "sealed_chunks": ints(0, MAX_CHUNKS),
    "manifest": st.one_of(MANIFESTS, st.none()),
    "error": st.one_of(plain_text(4000), hostile_text(4000)),
}
PLAIN_DONE = st.fixed_dictionaries(
    {"outcome": st.sampled_from(OUTCOMES)},
    optional={
        "exit_code": st.one_of(st.none(), st.integers(-(2**31), INT32_MAX)),
        "sealed_chunks": st.integers(0, MAX_CHUNKS),
        "manifest": st.builds(lambda h: {"count": len(h), "sha256": h}, st.lists(HASH, max_size=3)),
        "error": plain_text(4000),
    },
)

DONE_EXAMPLES: list[Any] = [
    {"outcome": "succeeded", "exit_code": 0},
    {"outcome": "failure", "exit_code": -9, "sealed_chunks": 3, "manifest": {"count": 3, "sha256": ["a" * 64] * 3}},
    {"outcome": "cancelled", "exit_code": None, "error": ""},
    {"outcome": "succeeded", "error": "boom"},
    {"outcome": "succeeded", "error": "two\nlines"},
    {"outcome": "succeeded", "error": "x" * 4001},
    {"outcome": "weird"},
    {"outcome": ["succeeded"]},
    {"exit_code": 0},
    {"outcome": "succeeded", "exit_code": 2**31},
    {"outcome": "succeeded", "exit_code": False},
    {"outcome": "succeeded", "sealed_chunks": None},
    {"outcome": "succeeded", "manifest": {"count": 1}},
    {"outcome": "succeeded", "manifest": {"count": 1, "sha256": ["a" * 65]}},
    {"outcome": "succeeded", "manifest": {"count": 1, "sha256": "abc"}},
    {"outcome": "succeeded", "manifest": {"count": 1, "sha256": [" a"], "extra": 1}},
    # A blank hash: the manifest's CharField does not allow_blank (the hand-written mirror once took it).
    {"outcome": "succeeded", "manifest": {"count": 1, "sha256": [""]}},
    {"outcome": "succeeded", "unknown": 1},
]


@GENERATED
@given(bodies(PLAIN_DONE, DONE_FIELDS, required=("outcome",)))
def test_it_reads_a_done_body_as_its_serializer_would(body: Any) -> None:
    assert_reads_as(DoneSerializer, DoneSerializer.fast_validate, body)


@pytest.mark.parametrize("body", DONE_EXAMPLES)
def test_it_reads_the_done_examples_as_its_serializer_would(body: Any) -> None:
    assert_reads_as(DoneSerializer, DoneSerializer.fast_validate, body)


@settings(deadline=None)
@given(PLAIN_DONE)
def test_it_reads_every_plain_done_body_itself(body: dict[str, Any]) -> None:
    assert assert_reads_as(DoneSerializer, DoneSerializer.fast_validate, body) is not None


# ---------------------------------------------------------------- the live push


def gzip64(data: bytes) -> str:
    return base64.b64encode(gzip.compress(data, mtime=0)).decode()


PUSH_DATA = st.one_of(
    st.binary(max_size=64).map(gzip64),
    st.binary(max_size=16).map(lambda b: base64.b64encode(b).decode()),  # base64, not a gzip
    st.binary(max_size=16).map(gzip64).map(lambda s: f" {s}"),
    st.binary(max_size=16).map(gzip64).map(lambda s: s.rstrip("=")),
    hostile_text(16),
)
LIVE_FIELDS = {"chunk_index": ints(0, MAX_CHUNKS - 1), "sealed_chunks": ints(0, MAX_CHUNKS), "data": PUSH_DATA}
PLAIN_LIVE = st.integers(0, MAX_CHUNKS - 1).flatmap(
    lambda chunk: st.fixed_dictionaries(
        {"chunk_index": st.just(chunk), "sealed_chunks": st.integers(0, chunk), "data": st.binary().map(gzip64)}
    )
)

_GZ = gzip64(b"out\n")
LIVE_EXAMPLES: list[Any] = [
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ},
    {"chunk_index": 7, "sealed_chunks": 7, "data": _GZ},
    {"chunk_index": 1, "sealed_chunks": 2, "data": _GZ},  # sealed past the active chunk
    {"chunk_index": 0, "sealed_chunks": 0, "data": "bm90IGd6aXA="},  # base64, not a gzip
    {"chunk_index": 0, "sealed_chunks": 0, "data": "***"},
    {"chunk_index": "0", "sealed_chunks": 0, "data": _GZ},  # DRF takes the string
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ, "extra": True},  # DRF drops the key
    {"chunk_index": True, "sealed_chunks": 0, "data": _GZ},
    {"chunk_index": 0, "sealed_chunks": 0, "data": ""},
    [],
    # Line times (optional): the same check on both paths.
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ, "times": [[0, 1_700_000_000_000], [4, 1_700_000_000_500]]},
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ, "times": None},
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ, "times": []},
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ, "times": [[4, 1], [4, 2]]},
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ, "times": [[0, True]]},
    {"chunk_index": 0, "sealed_chunks": 0, "data": _GZ, "times": "0,1"},
]


@GENERATED
@given(bodies(PLAIN_LIVE, LIVE_FIELDS, required=("chunk_index", "sealed_chunks", "data")))
@example({"chunk_index": 3, "sealed_chunks": 4, "data": _GZ})
def test_it_reads_a_live_push_as_its_serializer_would(body: Any) -> None:
    assert_reads_as(LivePushSerializer, LivePushSerializer.fast_validate, body)


@pytest.mark.parametrize("body", LIVE_EXAMPLES)
def test_it_reads_the_live_push_examples_as_its_serializer_would(body: Any) -> None:
    assert_reads_as(LivePushSerializer, LivePushSerializer.fast_validate, body)


@settings(deadline=None)
@given(PLAIN_LIVE)
def test_it_reads_every_plain_live_push_itself(body: dict[str, Any]) -> None:
    assert assert_reads_as(LivePushSerializer, LivePushSerializer.fast_validate, body) is not None


# ---------------------------------------------------------------- the accept's RunContext


PLAIN_SPEC = st.fixed_dictionaries(
    {"steps": st.lists(st.fixed_dictionaries({"name": st.text(max_size=8), "run": st.text(max_size=20)}),
                       max_size=3)},
    optional={"env": st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
              "timeout_seconds": st.one_of(st.none(), st.integers(1, 10**6))},
)  # fmt: skip
HOSTILE_SPEC = st.one_of(
    PLAIN_SPEC.map(lambda s: {**s, "extra": 1}),
    PLAIN_SPEC.map(lambda s: {**s, "steps": [*s["steps"], {"name": "n", "run": "r", "if": "x"}]}),
    PLAIN_SPEC.map(lambda s: {**s, "steps": [{"name": 5, "run": "r"}]}),
    PLAIN_SPEC.map(lambda s: {**s, "env": {"K": 1}}),
    PLAIN_SPEC.map(lambda s: {**s, "timeout_seconds": True}),
    PLAIN_SPEC.map(lambda s: {**s, "timeout_seconds": "60"}),
    st.none(),
)
LOGS = st.fixed_dictionaries({key: st.integers(0, 2**40) for key in
                              ("chunk_size_bytes", "seal_interval_s", "live_interval_s", "max_bytes")})  # fmt: skip
CONTEXTS = st.fixed_dictionaries(
    {
        "run_id": st.uuids(),
        "deployment_id": st.one_of(st.integers(1, 2**40), st.booleans()),
        "stack_id": st.integers(1, 2**40),
        "spec": st.one_of(PLAIN_SPEC, PLAIN_SPEC, HOSTILE_SPEC),
        "secrets": st.one_of(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
                             st.just({"K": 5})),
        "scm": st.one_of(st.none(), st.just({"url": "https://example.com/r.git"})),
        "logs": st.one_of(LOGS, LOGS.map(lambda d: {**d, "max_bytes": True}), LOGS.map(lambda d: {**d, "x": 1})),
        "status_interval_s": st.one_of(st.integers(1, 3600), st.just(5.0)),
        "api_token": st.one_of(st.text(max_size=12), st.integers()),
    }
)  # fmt: skip


@GENERATED
@given(CONTEXTS)
def test_it_renders_a_run_context_as_its_serializer_would(context: dict[str, Any]) -> None:
    fast = RunContextSerializer.fast_represent(context)
    if fast is not None:
        assert render(fast) == render(RunContextSerializer(context).data)


@settings(deadline=None)
@given(CONTEXTS.filter(lambda c: type(c["deployment_id"]) is int and c["scm"] is None and type(c["api_token"]) is str
                       and type(c["status_interval_s"]) is int and len(c["logs"]) == 4
                       and type(c["logs"]["max_bytes"]) is int and "K" not in c["secrets"]),
       PLAIN_SPEC)  # fmt: skip
def test_it_renders_every_plain_run_context_itself(context: dict[str, Any], spec: dict[str, Any]) -> None:
    fast = RunContextSerializer.fast_represent({**context, "spec": spec})
    assert fast is not None
    assert render(fast) == render(RunContextSerializer({**context, "spec": spec}).data)


# ---------------------------------------------------------------- the claim and the status


@GENERATED
@given(
    st.uuids(),
    st.uuids(),
    st.text(max_size=40),
    st.datetimes(timezones=st.one_of(st.none(), st.just(UTC), st.builds(
        lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(-12 * 60, 14 * 60)))),
)  # fmt: skip
@example(uuid.uuid4(), uuid.uuid4(), "a.b.c", datetime(2026, 12, 1, 18, 30, 5, 123456, tzinfo=UTC))
def test_it_renders_a_claim_as_its_serializer_would(run: uuid.UUID, runner: uuid.UUID, token: str,
                                                    expires: datetime) -> None:  # fmt: skip
    claim = Claim(run_id=run, runner_id=runner, runner_token=token, assigned_expires_at=expires)
    fields = {name: getattr(claim, name) for name in ("run_id", "runner_id", "runner_token", "assigned_expires_at")}
    assert render(ClaimSerializer.fast_represent(claim)) == render(ClaimSerializer(fields).data)


@pytest.mark.parametrize("run_status", list(RunStatus))
def test_it_renders_a_status_as_its_serializer_would(run_status: RunStatus) -> None:
    fast = RunStatusSerializer.fast_represent(run_status)
    assert render(fast) == render(RunStatusSerializer(fast).data)
    assert fast["cancel_requested"] is (run_status in (RunStatus.REQUESTED_CANCELLATION, RunStatus.CANCELLING))
