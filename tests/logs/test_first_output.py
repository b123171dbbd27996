"""run.first_output_at (stamped once, by the first push with output, on both push paths), the push's
notification to parked readers, and ``wait`` on the log read outside gantry.asgi (docs/logs.md)."""

from __future__ import annotations

import gzip
from typing import Any

import pytest

from gantry.core.models import Run
from gantry.logs import live, services
from gantry.redis import client as redis_client

from .conftest import Executing


def first_output_at(executing: Executing) -> Any:
    return Run.objects.values_list("first_output_at", flat=True).get(id=executing.run.id)


def test_the_first_push_with_output_stamps_first_output_at_and_later_ones_do_not(executing: Executing) -> None:
    assert executing.push(0, 0, "").status_code == 204  # no output yet (an empty active chunk)
    assert first_output_at(executing) is None
    assert executing.push(0, 0, "hello\n").status_code == 204
    stamped = first_output_at(executing)
    assert stamped is not None
    assert executing.push(0, 0, "hello\nagain\n").status_code == 204
    assert executing.push(1, 1, "next chunk\n").status_code == 204
    assert first_output_at(executing) == stamped


def test_the_fast_lane_push_stamps_through_the_same_rule(executing: Executing) -> None:
    push: dict[str, Any] = {"chunk_index": 0, "sealed_chunks": 0, "data": gzip.compress(b"hi\n")}
    ids: dict[str, Any] = {
        "run_id": executing.run.id, "runner_id": executing.runner.id, "runner_group_id": executing.group.id
    }  # fmt: skip
    assert services.live_push_hot(**ids, **push)
    stamped = first_output_at(executing)
    assert stamped is not None
    Run.objects.filter(id=executing.run.id).update(first_output_at=None)
    assert services.live_push_hot(**ids, **push)
    assert first_output_at(executing) is None  # the marker decided: one write per run, not per push


def test_a_run_whose_only_output_sealed_counts_as_output() -> None:
    empty = gzip.compress(b"")
    assert not live.has_output(chunk_index=0, sealed_chunks=0, data=empty)
    assert live.has_output(chunk_index=0, sealed_chunks=0, data=gzip.compress(b"x"))
    assert live.has_output(chunk_index=1, sealed_chunks=1, data=empty)
    assert live.has_output(chunk_index=1, sealed_chunks=0, data=empty)


def test_a_push_and_the_records_deletion_are_published_on_the_runs_channel(executing: Executing) -> None:
    pubsub = redis_client().pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(live.channel(executing.run.id))
    try:
        assert pubsub.get_message(timeout=1) is None  # the subscription, ignored
        executing.push(0, 0, "a line\n")
        message = pubsub.get_message(timeout=5)
        assert message is not None
        assert message["data"] == str(executing.run.id).encode()
        live.delete(executing.run.id)
        message = pubsub.get_message(timeout=5)
        assert message is not None
        assert message["data"] == str(executing.run.id).encode()
    finally:
        pubsub.close()


@pytest.mark.parametrize("bad", ["x", "-1", "30.5", "nan", "inf", ""])
def test_a_bad_wait_is_400_and_reads_nothing(executing: Executing, owner_api: Any, bad: str) -> None:
    answer = owner_api.get(f"/api/v1/runs/{executing.run.id}/logs?offset=0&wait={bad}")
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"


def test_outside_gantry_asgi_wait_is_ignored_with_the_same_answer(executing: Executing, owner_api: Any) -> None:
    executing.push(0, 0, "so far\n")
    plain = owner_api.get(f"/api/v1/runs/{executing.run.id}/logs?offset=7")
    waited = owner_api.get(f"/api/v1/runs/{executing.run.id}/logs?offset=7&wait=30")
    assert plain.status_code == waited.status_code == 200
    assert plain.json() == waited.json() == {"text": "", "next_offset": 7, "complete": False, "final": False}
