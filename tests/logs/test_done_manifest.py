"""POST /runs/{run_id}/done with the manifest: kept on the run, checked against sealed_chunks."""

from __future__ import annotations

from typing import Any

import pytest

from gantry.core.models import Run, RunStatus
from gantry.logs import live
from gantry.logs.limits import CHUNK_GZIP_MAX, CHUNK_SIZE

from .conftest import Executing


def test_it_keeps_the_manifest_and_deletes_the_live_record(executing: Executing) -> None:
    hashes = executing.seal(["a\n", "b\n"])
    executing.push(2, 2, "")
    assert executing.done([h.upper() for h in hashes]).status_code == 204
    run = Run.objects.get(id=executing.run.id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.log_manifest == {"count": 2, "sha256": hashes}
    assert run.sealed_chunks == 2
    live.flush_deletes()  # /done queues the record's delete; the sweep sends it within a second
    assert live.get(executing.run.id) is None


@pytest.mark.parametrize(
    "body",
    [
        {"sealed_chunks": 2, "manifest": {"count": 2, "sha256": ["a" * 64]}},
        {"sealed_chunks": 3, "manifest": {"count": 2, "sha256": ["a" * 64, "b" * 64]}},
        {"sealed_chunks": 1, "manifest": {"count": 1, "sha256": ["not a hash"]}},
    ],
)
def test_it_refuses_a_manifest_that_contradicts_itself(executing: Executing, body: dict[str, Any]) -> None:
    executing.push(0, 0, "kept")
    answer = executing.api.post(
        f"/api/v1/runs/{executing.run.id}/done", {"outcome": "succeeded", "exit_code": 0, **body}, format="json"
    )
    assert answer.status_code == 400, answer.content
    run = Run.objects.get(id=executing.run.id)
    assert run.status == RunStatus.RUNNING, "a refused /done changes nothing"
    assert run.log_manifest is None
    assert live.get(executing.run.id) is not None


def test_a_manifest_without_sealed_chunks_sets_the_count(executing: Executing) -> None:
    hashes = executing.seal(["x\n"])
    body = {"outcome": "failure", "exit_code": 3, "manifest": {"count": 1, "sha256": hashes}}
    assert executing.api.post(f"/api/v1/runs/{executing.run.id}/done", body, format="json").status_code == 204
    assert Run.objects.get(id=executing.run.id).sealed_chunks == 1


def test_a_replayed_done_keeps_the_first_manifest(executing: Executing) -> None:
    hashes = executing.seal(["x\n"])
    assert executing.done(hashes).status_code == 204
    assert executing.done(hashes).status_code == 204
    assert Run.objects.get(id=executing.run.id).log_manifest == {"count": 1, "sha256": hashes}


def test_a_push_may_carry_the_gzip_of_a_whole_chunk_sealed_a_line_late() -> None:
    assert CHUNK_GZIP_MAX >= 2 * CHUNK_SIZE
