"""gantry.logs.flush_live_log: the reaper's seam that keeps a lost runner's partial log."""

from __future__ import annotations

import gzip
from typing import Any

from rest_framework.test import APIClient

from gantry.core.models import Run
from gantry.logs import flush_live_log, live
from gantry.logs.reader import lost_line
from gantry.logs.storage import get_storage

from .conftest import Executing, gz, sha

LOST = lost_line().decode()


def _read(api: APIClient, run: Run) -> Any:
    return api.get(f"/api/v1/runs/{run.id}/logs").json()


def test_it_writes_the_last_snapshot_as_the_final_chunk(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["sealed part\n"])
    executing.push(1, 1, "partial line the runner never sealed")
    executing.advance("fail")  # the inactive-runner reaper: runner lost

    assert flush_live_log(executing.run.id) is True

    record_gone = live.get(executing.run.id) is None
    assert record_gone
    assert gzip.decompress(get_storage().get(executing.run.id, 1) or b"") == b"partial line the runner never sealed"
    run = Run.objects.get(id=executing.run.id)
    assert run.log_manifest == {
        "count": 2,
        "sha256": [None, sha(gz("partial line the runner never sealed"))],
        "flushed_chunk": 1,
    }
    # The partial log, then a line saying the rest is lost: final, but not known whole.
    assert _read(teammate_api, run) == {
        "text": "sealed part\npartial line the runner never sealed\n" + LOST,
        "next_offset": 48 + 1 + len(LOST),
        "complete": False,
        "final": True,
    }


def test_the_text_is_the_same_before_and_after_the_flush(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["a\n", "b\n"])
    executing.push(2, 2, "c")
    executing.advance("fail")
    before = _read(teammate_api, executing.run)
    assert flush_live_log(executing.run.id)
    after = _read(teammate_api, executing.run)
    # The same text either side of the flush: the loss is said as soon as it is known.
    assert before == after
    assert after["text"] == "a\nb\nc\n" + LOST
    assert (after["complete"], after["final"]) == (False, True)


def test_it_marks_a_chunk_that_was_in_flight_when_the_runner_died(
    executing: Executing, teammate_api: APIClient
) -> None:
    executing.seal(["zero\n"])
    executing.push(2, 1, "two")  # chunk 1 was being uploaded; it never arrived
    executing.advance("fail")
    assert flush_live_log(executing.run.id)
    assert _read(teammate_api, executing.run)["text"] == "zero\n[gantry: log chunk 1 missing]\ntwo\n" + LOST


def test_it_keeps_the_runners_own_upload_when_it_landed_first(executing: Executing, teammate_api: APIClient) -> None:
    executing.push(0, 0, "prefix")
    executing.seal(["prefix and the rest\n"])  # uploaded, but the runner died before its next push
    executing.advance("fail")
    assert flush_live_log(executing.run.id)
    run = Run.objects.get(id=executing.run.id)
    assert run.log_manifest is not None
    assert run.log_manifest["sha256"] == [None]
    assert _read(teammate_api, run)["text"] == "prefix and the rest\n" + LOST


def test_it_leaves_an_executing_run_alone(executing: Executing) -> None:
    executing.push(0, 0, "still going")
    assert flush_live_log(executing.run.id) is False
    assert get_storage().get(executing.run.id, 0) is None
    assert live.get(executing.run.id) is not None
    assert Run.objects.get(id=executing.run.id).log_manifest is None


def test_it_does_not_override_the_manifest_of_done(executing: Executing) -> None:
    hashes = executing.seal(["all of it\n"])
    assert executing.done(hashes).status_code == 204
    live.store(executing.run.id, chunk_index=1, sealed_chunks=1, data=gz("a stale tick"))  # a late push raced /done
    assert flush_live_log(executing.run.id) is False
    assert live.get(executing.run.id) is None
    assert get_storage().get(executing.run.id, 1) is None
    assert Run.objects.get(id=executing.run.id).log_manifest == {"count": 1, "sha256": hashes}


def test_a_runner_lost_before_its_first_push_leaves_a_log_that_says_so(
    executing: Executing, teammate_api: APIClient
) -> None:
    """Nothing reached storage or Redis: the log is not silently empty and 'complete' (issue 10)."""
    executing.advance("fail")
    assert flush_live_log(executing.run.id) is True
    assert Run.objects.get(id=executing.run.id).log_manifest == {"count": 0, "sha256": [], "lost": True}
    page = _read(teammate_api, executing.run)
    assert page == {
        "text": LOST,
        "next_offset": len(LOST),
        "complete": False,
        "final": True,
    }


def test_a_live_record_lost_to_a_redis_restart_keeps_the_sealed_chunks_and_says_the_rest_is_lost(
    executing: Executing, teammate_api: APIClient
) -> None:
    executing.seal(["sealed before the restart\n"])
    executing.push(1, 1, "this live tail was in Redis")
    live.delete(executing.run.id)  # what a Redis restart does to it
    executing.advance("fail")
    assert flush_live_log(executing.run.id) is True
    page = _read(teammate_api, executing.run)
    assert page["text"] == "sealed before the restart\n" + LOST
    assert (page["complete"], page["final"]) == (False, True)


def test_it_has_nothing_to_flush_for_a_run_that_never_started(executing: Executing) -> None:
    from gantry.core.models import RunStatus

    Run.objects.filter(id=executing.run.id).update(status=RunStatus.CANCELLED, started_at=None)
    assert flush_live_log(executing.run.id) is False
    assert Run.objects.get(id=executing.run.id).log_manifest is None


def test_it_writes_no_empty_chunk(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["everything\n"])
    executing.push(1, 1, "")
    executing.advance("fail")
    assert flush_live_log(executing.run.id) is True
    assert get_storage().get(executing.run.id, 1) is None
    assert _read(teammate_api, executing.run)["text"] == "everything\n" + LOST


def test_it_flushes_to_s3(executing: Executing, teammate_api: APIClient, s3: Any) -> None:
    executing.seal(["on S3\n"])
    executing.push(1, 1, "last words")
    executing.advance("fail")
    assert flush_live_log(executing.run.id)
    assert _read(teammate_api, executing.run)["text"] == "on S3\nlast words\n" + LOST
