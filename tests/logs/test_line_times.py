"""Line times (docs/logs.md): marks sent beside the chunks, kept beside them, answered by the read with ?times=1.

The log's bytes never change: the raw read (and the sealed chunks in
storage) are the same with or without times, and a runner that sends none
(an older one) reads exactly as before.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from rest_framework.test import APIClient

from gantry.logs import flush_live_log, live
from gantry.logs.limits import TIME_MARKS_MAX
from gantry.logs.storage import get_storage

from .conftest import BUCKET, Executing, gz, sha

T0 = 1_700_000_000_000


def push(executing: Executing, chunk_index: int, sealed: int, text: str, times: Any) -> Any:
    body = {"chunk_index": chunk_index, "sealed_chunks": sealed, "data": base64.b64encode(gz(text)).decode()}
    if times is not ...:
        body["times"] = times
    return executing.api.post(f"/api/v1/runs/{executing.run.id}/logs/live", body, format="json")


def handout(executing: Executing, n: int, data: bytes, times: Any) -> Any:
    body = {"sha256": sha(data), "size": len(data), "times": times}
    return executing.api.post(f"/api/v1/runs/{executing.run.id}/logs/chunks/{n}", body, format="json")


def read(api: APIClient, executing: Executing, offset: int = 0, times: str | None = "1") -> Any:
    query = f"?offset={offset}" + (f"&times={times}" if times is not None else "")
    answer = api.get(f"/api/v1/runs/{executing.run.id}/logs{query}")
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_it_answers_the_live_chunks_marks_as_log_offsets(executing: Executing, teammate_api: APIClient) -> None:
    assert push(executing, 0, 0, "one\ntwo\nthree\n", [[0, T0], [8, T0 + 2500]]).status_code == 204
    page = read(teammate_api, executing)
    assert page["text"] == "one\ntwo\nthree\n"
    assert page["times"] == [[0, T0], [8, T0 + 2500]]
    # Without ?times=1 the answer is the one it always was.
    assert "times" not in read(teammate_api, executing, times=None)


def test_sealed_chunks_marks_are_kept_beside_the_chunk_and_shifted_to_log_offsets(
    executing: Executing, teammate_api: APIClient
) -> None:
    first = gz("aaaa\nbb\n")  # 8 bytes
    assert handout(executing, 0, first, [[0, T0], [5, T0 + 1000]]).status_code == 200
    assert executing.upload(0, first) in (200, 201)
    assert push(executing, 1, 1, "cc\n", [[0, T0 + 4000]]).status_code == 204
    # The chunk in storage is the log's bytes only; the marks are an object of their own.
    assert get_storage().get(executing.run.id, 0) == first
    assert get_storage().get_times(executing.run.id, 0) == b"[[0,1700000000000],[5,1700000001000]]"

    page = read(teammate_api, executing)
    assert page["text"] == "aaaa\nbb\ncc\n"
    assert page["times"] == [[0, T0], [5, T0 + 1000], [8, T0 + 4000]]
    # From an offset inside a line: the mark that line falls under comes first.
    assert read(teammate_api, executing, offset=6)["times"] == [[5, T0 + 1000], [8, T0 + 4000]]
    assert read(teammate_api, executing, offset=8)["times"] == [[8, T0 + 4000]]


def test_an_older_runner_without_times_reads_as_before(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["plain\n"])
    assert executing.push(1, 1, "live\n").status_code == 204
    page = read(teammate_api, executing)
    assert page == {"text": "plain\nlive\n", "next_offset": 11, "complete": False, "final": False, "times": []}


def test_the_flush_keeps_the_last_snapshots_marks(executing: Executing, teammate_api: APIClient) -> None:
    assert push(executing, 0, 0, "last words\n", [[0, T0]]).status_code == 204
    executing.advance("fail")  # the runner is lost
    assert flush_live_log(executing.run.id) is True
    assert live.get(executing.run.id) is None
    page = read(teammate_api, executing)
    assert page["times"][:1] == [[0, T0]]
    assert page["text"].startswith("last words\n")


@pytest.mark.parametrize(
    "times",
    [
        "soon",
        [[0]],
        [[0, T0, 1]],
        [[0, "1"]],
        [[True, T0]],
        [[-1, T0]],
        [[5, T0], [5, T0]],  # offsets must increase
        [[5, T0], [2, T0]],
        [[0, -1]],
        [[0, 2**53 + 1]],
        [[i, T0] for i in range(TIME_MARKS_MAX + 1)],
    ],
)
def test_it_refuses_malformed_times_and_keeps_nothing(
    executing: Executing, teammate_api: APIClient, times: Any
) -> None:
    answer = push(executing, 0, 0, "x\n", times)
    assert answer.status_code == 400, answer.content
    assert "times" in answer.json()["fields"]
    assert live.get(executing.run.id) is None
    data = gz("y\n")
    answer = handout(executing, 0, data, times)
    assert answer.status_code == 400
    assert "times" in answer.json()["fields"]
    assert get_storage().get_times(executing.run.id, 0) is None


def test_it_refuses_a_times_flag_that_is_not_0_or_1(executing: Executing, teammate_api: APIClient) -> None:
    answer = teammate_api.get(f"/api/v1/runs/{executing.run.id}/logs?times=yes")
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"


def test_null_times_are_no_times(executing: Executing, teammate_api: APIClient) -> None:
    assert push(executing, 0, 0, "z\n", None).status_code == 204
    assert read(teammate_api, executing)["times"] == []


def test_on_s3_the_marks_are_an_object_beside_the_chunks(
    executing: Executing, teammate_api: APIClient, s3: Any
) -> None:
    data = gz("one\ntwo\n")
    assert handout(executing, 0, data, [[0, T0], [4, T0 + 700]]).status_code == 200
    assert executing.upload(0, data) == 200
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{executing.run.id}/")["Contents"])
    assert keys == [f"runs/{executing.run.id}/chunks/00000000.gz", f"runs/{executing.run.id}/times/00000000.json"]
    # A retried handout (the same marks) keeps the first write.
    assert handout(executing, 0, data, [[0, T0], [4, T0 + 700]]).status_code == 200
    executing.done([sha(data)])
    page = read(teammate_api, executing)
    assert (page["text"], page["times"], page["complete"]) == ("one\ntwo\n", [[0, T0], [4, T0 + 700]], True)
    # Retention deletes them with the run's chunks.
    assert get_storage().delete_runs([executing.run.id]) == {}
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{executing.run.id}/").get("KeyCount") == 0
