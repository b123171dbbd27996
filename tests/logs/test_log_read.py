"""GET /runs/{id}/logs?offset=N: sealed chunks, the live chunk, following, gap markers, truncation, scoping."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from gantry import conf
from gantry.core.models import Run
from gantry.logs import live
from gantry.logs.reader import INDEX_KEY, incomplete_tail, read_log
from gantry.logs.storage import get_storage
from gantry.redis import client as redis_client

from .conftest import Executing, gz, sha


def read(api: APIClient, run: Run | uuid.UUID, offset: int | str = 0) -> Any:
    run_id = run.id if isinstance(run, Run) else run
    answer = api.get(f"/api/v1/runs/{run_id}/logs", {"offset": offset})
    assert answer.status_code == 200, answer.content
    return answer.json()


def read_all(api: APIClient, run: Run, offset: int = 0) -> tuple[str, int, bool]:
    """Follow pages until the log stops growing for now (or completes)."""
    text = ""
    while True:
        page = read(api, run, offset)
        text += page["text"]
        if page["complete"] or page["next_offset"] == offset:
            return text, page["next_offset"], page["complete"]
        offset = page["next_offset"]


@pytest.fixture
def max_bytes(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setenv("GANTRY_LOG_MAX_BYTES", "2048")
    conf.get.cache_clear()
    yield 2048
    monkeypatch.delenv("GANTRY_LOG_MAX_BYTES")
    conf.get.cache_clear()


# ---------------------------------------------------------------- sealed and live


def test_it_reads_sealed_chunks_then_the_live_chunk(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["one\ntw", "o\nthree\n"])
    executing.push(2, 2, "four (so far")
    page = read(teammate_api, executing.run)
    assert page == {"text": "one\ntwo\nthree\nfour (so far", "next_offset": 26, "complete": False, "final": False}


def test_it_follows_a_running_log_and_completes_after_done(executing: Executing, teammate_api: APIClient) -> None:
    seen = ""
    executing.push(0, 0, "step 1 starts\n")
    text, offset, complete = read_all(teammate_api, executing.run)
    seen += text
    assert (seen, complete) == ("step 1 starts\n", False)

    # The live chunk grows; the reader sends only what is new.
    executing.push(0, 0, "step 1 starts\nworking")
    text, offset, _ = read_all(teammate_api, executing.run, offset)
    assert text == "working"
    seen += text

    # Chunk 0 seals (a superset of the snapshot); chunk 1 is live.
    hashes = executing.seal(["step 1 starts\nworking...\n"])
    executing.push(1, 1, "step 2\n")
    text, offset, _ = read_all(teammate_api, executing.run, offset)
    assert text == "...\nstep 2\n"
    seen += text

    hashes += [executing.seal_one(1, "step 2\ndone\n")]
    assert executing.done(hashes).status_code == 204
    # The reader goes by the manifest from here: the record, still there until
    # the delete sweep, changes nothing it answers.
    text, offset, complete = read_all(teammate_api, executing.run, offset)
    seen += text
    assert (text, complete) == ("done\n", True)
    assert seen == "step 1 starts\nworking...\nstep 2\ndone\n"
    assert read(teammate_api, executing.run, offset) == {
        "text": "",
        "next_offset": offset,
        "complete": True,
        "final": True,
    }
    assert live.get(executing.run.id) is not None, "the read above was judged with the live record still there"
    live.flush_deletes()
    assert live.get(executing.run.id) is None, "/done's delete reaches Redis with the sweep"


def test_it_hides_a_live_chunk_that_is_not_the_next_one(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["zero\n"])
    # Chunk 1 is being uploaded (sealed_chunks still 1) while chunk 2 is live.
    executing.push(2, 1, "two\n")
    assert read(teammate_api, executing.run)["text"] == "zero\n"


def test_it_probes_storage_when_there_is_no_live_record(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["a\n", "b\n", "c\n"])
    assert read(teammate_api, executing.run) == {
        "text": "a\nb\nc\n",
        "next_offset": 6,
        "complete": False,
        "final": False,
    }


def test_it_reads_a_run_finished_without_a_manifest(executing: Executing, teammate_api: APIClient) -> None:
    executing.seal(["a\n", "b\n"])
    answer = executing.api.post(
        f"/api/v1/runs/{executing.run.id}/done", {"outcome": "succeeded", "exit_code": 0}, format="json"
    )
    assert answer.status_code == 204
    assert read(teammate_api, executing.run) == {"text": "a\nb\n", "next_offset": 4, "complete": True, "final": True}


def test_a_run_that_never_started_has_an_empty_log(executing: Executing, teammate_api: APIClient) -> None:
    executing.advance("finish_succeeded")
    assert read(teammate_api, executing.run) == {"text": "", "next_offset": 0, "complete": True, "final": True}


def test_it_probes_s3_while_the_run_executes(executing: Executing, teammate_api: APIClient, s3: Any) -> None:
    executing.seal(["a\n", "b\n"])
    assert read(teammate_api, executing.run) == {"text": "a\nb\n", "next_offset": 4, "complete": False, "final": False}
    executing.seal_one(2, "c\n")
    assert read(teammate_api, executing.run, 4) == {"text": "c\n", "next_offset": 6, "complete": False, "final": False}


def test_it_reads_the_log_from_s3(executing: Executing, teammate_api: APIClient, s3: Any) -> None:
    hashes = executing.seal(["from\n", "S3\n"])
    assert executing.done(hashes).status_code == 204
    assert read(teammate_api, executing.run) == {
        "text": "from\nS3\n",
        "next_offset": 8,
        "complete": True,
        "final": True,
    }


# ---------------------------------------------------------------- gaps and truncation


def test_it_marks_a_missing_chunk(executing: Executing, teammate_api: APIClient) -> None:
    hashes = executing.seal(["zero\n", "one\n", "two, no newline"])
    for n in (1, 2):
        get_storage().path(executing.run.id, n).unlink()  # type: ignore[attr-defined]
    hashes.append(sha(gz("never uploaded")))
    assert executing.done(hashes).status_code == 204
    page = read(teammate_api, executing.run)
    assert page["text"] == (
        "zero\n[gantry: log chunk 1 missing]\n[gantry: log chunk 2 missing]\n[gantry: log chunk 3 missing]\n"
    )
    # Every chunk is accounted for, but three are gone: final, not whole.
    assert (page["complete"], page["final"]) == (False, True)


def test_it_marks_a_corrupt_chunk_on_its_own_line(executing: Executing, teammate_api: APIClient) -> None:
    hashes = executing.seal(["half a li", "ne\n", "tail\n"])
    hashes[1] = sha(b"what the runner thought it sent")
    assert executing.done(hashes).status_code == 204
    page = read(teammate_api, executing.run)
    assert page["text"] == "half a li\n[gantry: log chunk 1 corrupt]\ntail\n"


def test_it_marks_a_chunk_that_is_not_gzip_as_corrupt(executing: Executing, teammate_api: APIClient) -> None:
    garbage = b"\x1f\x8b but not really gzip"
    assert get_storage().put(executing.run.id, 0, garbage)
    assert executing.done([sha(garbage)]).status_code == 204
    assert read(teammate_api, executing.run)["text"] == "[gantry: log chunk 0 corrupt]\n"


def test_it_truncates_past_the_max_with_a_final_line(
    executing: Executing, teammate_api: APIClient, max_bytes: int
) -> None:
    line = "0123456789" * 9 + "\n"  # 91 bytes
    body = line * 40  # 3640 bytes, over 2048
    hashes = executing.seal([body[:1500], body[1500:]])
    assert executing.done(hashes).status_code == 204
    page = read(teammate_api, executing.run)
    cut = body.encode()[:max_bytes].decode()
    assert not cut.endswith("\n")
    assert page["text"] == cut + "\n[gantry: log truncated at 2048 bytes (GANTRY_LOG_MAX_BYTES)]\n"
    assert page["complete"] is True
    # Read from just past the cut: the line still comes, whole.
    tail = read(teammate_api, executing.run, max_bytes)
    assert tail["text"] == "\n[gantry: log truncated at 2048 bytes (GANTRY_LOG_MAX_BYTES)]\n"


def test_it_truncates_a_running_log_too(executing: Executing, teammate_api: APIClient, max_bytes: int) -> None:
    executing.seal(["x" * 2047 + "\n"])
    executing.push(1, 1, "over the limit\n")
    page = read(teammate_api, executing.run)
    assert page["text"] == "x" * 2047 + "\n[gantry: log truncated at 2048 bytes (GANTRY_LOG_MAX_BYTES)]\n"
    assert page["complete"] is False


# ---------------------------------------------------------------- bytes, pages and characters


def test_it_never_splits_a_character_across_pages_or_chunks(executing: Executing) -> None:
    text = "".join(f"ligne {i}: café ☕ 𝄞\n" for i in range(200))
    raw = text.encode()
    # Chunk boundaries at arbitrary bytes, some inside characters.
    cuts = [0, 101, 233, 2000, 2003, len(raw)]
    hashes = []
    for n, (a, b) in enumerate(itertools.pairwise(cuts)):
        data = gz(raw[a:b])
        assert get_storage().put(executing.run.id, n, data)
        hashes.append(sha(data))
    assert executing.done(hashes).status_code == 204
    run = Run.objects.get(id=executing.run.id)
    for limit in (7, 50, 333):
        offset, pages = 0, []
        while True:
            page = read_log(run, offset=offset, limit=limit)
            assert "\ufffd" not in page.text
            pages.append(page.text)
            if page.complete:
                break
            assert page.next_offset > offset
            offset = page.next_offset
        assert "".join(pages) == text


def test_it_holds_back_an_unfinished_character_at_the_live_tail(executing: Executing, teammate_api: APIClient) -> None:
    raw = "price: 5€".encode()
    executing.push(0, 0, raw[:-1])  # the runner captured 2 of the € sign's 3 bytes so far
    page = read(teammate_api, executing.run)
    assert page == {"text": "price: 5", "next_offset": len(raw) - 3, "complete": False, "final": False}
    executing.push(0, 0, raw)
    assert read(teammate_api, executing.run, page["next_offset"])["text"] == "€"


def test_it_replaces_invalid_bytes_at_the_end_of_a_finished_log(executing: Executing, teammate_api: APIClient) -> None:
    hashes = executing.seal([b"ok \xe2\x82"])
    assert executing.done(hashes).status_code == 204
    assert read(teammate_api, executing.run) == {"text": "ok \ufffd", "next_offset": 5, "complete": True, "final": True}


@pytest.mark.parametrize(
    ("data", "held"),
    [(b"", 0), (b"abc", 0), (b"a\xc3", 1), (b"a\xc3\xa9", 0), (b"\xe2\x82", 2), (b"\xf0\x9d\x84", 3), (b"\x80\x80", 0)],
)
def test_incomplete_tail(data: bytes, held: int) -> None:
    assert incomplete_tail(data) == held


# ---------------------------------------------------------------- efficiency


def test_it_maps_an_offset_without_downloading_the_chunks_before_it(
    executing: Executing, teammate_api: APIClient, log_dir: Path
) -> None:
    hashes = executing.seal(["a" * 99 + "\n", "b" * 99 + "\n", "c" * 99 + "\n"])
    assert executing.done(hashes).status_code == 204
    read(teammate_api, executing.run)
    assert len(redis_client().hgetall(INDEX_KEY.format(run_id=executing.run.id))) == 3
    # Chunks are write-once, so the index stays right; remove chunk 0's file
    # to prove that reading past it does not open it again.
    get_storage().path(executing.run.id, 0).unlink()  # type: ignore[attr-defined]
    assert read(teammate_api, executing.run, 150) == {
        "text": "b" * 49 + "\n" + "c" * 99 + "\n",
        "next_offset": 300,
        "complete": True,
        "final": True,
    }


def test_it_notices_a_chunk_removed_from_storage_after_it_was_indexed(
    executing: Executing, teammate_api: APIClient
) -> None:
    hashes = executing.seal(["kept\n", "removed later\n"])
    assert executing.done(hashes).status_code == 204
    read(teammate_api, executing.run)
    get_storage().path(executing.run.id, 1).unlink()  # type: ignore[attr-defined]
    read(teammate_api, executing.run, 5)  # this read finds the hole
    assert read(teammate_api, executing.run)["text"] == "kept\n[gantry: log chunk 1 missing]\n"


def test_it_reads_correctly_without_redis(executing: Executing, teammate_api: APIClient) -> None:
    hashes = executing.seal(["a\n", "b\n"])
    assert executing.done(hashes).status_code == 204
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        assert read(teammate_api, executing.run, 2) == {
            "text": "b\n",
            "next_offset": 4,
            "complete": True,
            "final": True,
        }


# ---------------------------------------------------------------- who may read


def test_it_lets_members_read_and_hides_the_log_from_other_orgs(
    executing: Executing, owner_api: APIClient, teammate_api: APIClient, outsider_api: APIClient, root_api: APIClient
) -> None:
    executing.seal(["secret\n"])
    path = f"/api/v1/runs/{executing.run.id}/logs"
    assert owner_api.get(path).status_code == 200
    assert root_api.get(path).status_code == 200
    answer = outsider_api.get(path)
    assert answer.status_code == 404
    assert b"secret" not in answer.content
    assert teammate_api.get(f"/api/v1/runs/{uuid.uuid4()}/logs").status_code == 404


def test_it_refuses_runner_tokens_and_anonymous_readers(executing: Executing, anon: APIClient) -> None:
    path = f"/api/v1/runs/{executing.run.id}/logs"
    assert executing.api.get(path).status_code == 403
    assert anon.get(path).status_code == 401


@pytest.mark.parametrize("offset", ["-1", "x", "1.5"])
def test_it_refuses_a_bad_offset(executing: Executing, teammate_api: APIClient, offset: str) -> None:
    answer = teammate_api.get(f"/api/v1/runs/{executing.run.id}/logs", {"offset": offset})
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"
