"""POST /runs/{run_id}/logs/chunks/{n} and the PUT that follows: local signed URL and S3 presigned URL.

Each sealed chunk is stored exactly once: a retried PUT of the same bytes is
harmless, different bytes at a taken key are refused and change nothing.
"""

from __future__ import annotations

import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from gantry.core import tokens
from gantry.core.models import RunnerGroup, Stack
from gantry.logs.limits import CHUNK_GZIP_MAX, MAX_CHUNKS, UPLOAD_URL_TTL
from gantry.logs.storage import S3Storage, get_storage

from ..core.drive import drive
from .conftest import BUCKET, Executing, bearer, gz, http_put, sha


def _put_local(url: str, data: bytes) -> Any:
    return APIClient().generic("PUT", url, data, content_type="application/gzip")


# ---------------------------------------------------------------- local storage


def test_it_hands_out_gantrys_own_upload_url_and_stores_the_chunk(executing: Executing, log_dir: Path) -> None:
    data = gz("line 1\nline 2\n")
    answer = executing.handout(0, data)
    assert answer.status_code == 200, answer.content
    put = answer.json()
    assert put["method"] == "PUT"
    assert put["url"].startswith("http://testserver/api/v1/log-uploads/")
    assert put["headers"] == {"Content-Type": "application/gzip"}
    assert put["expires_at"]

    assert _put_local(put["url"], data).status_code == 201
    stored = log_dir / "runs" / str(executing.run.id) / "chunks" / "00000000.gz"
    assert stored.read_bytes() == data
    assert [p.name for p in stored.parent.iterdir()] == ["00000000.gz"], "no temporary files left behind"


def test_it_stores_a_chunk_exactly_once(executing: Executing, log_dir: Path) -> None:
    first = gz("the real chunk\n")
    url = executing.handout(3, first).json()["url"]
    assert _put_local(url, first).status_code == 201
    # A retry whose first answer was lost: same bytes, success, nothing rewritten.
    assert _put_local(url, first).status_code == 200
    # Other bytes for the same chunk, even with a URL issued for them: refused.
    other = gz("an impostor\n")
    answer = _put_local(executing.handout(3, other).json()["url"], other)
    assert answer.status_code == 409
    assert answer.json()["code"] == "chunk_exists"
    assert get_storage().get(executing.run.id, 3) == first


def test_it_takes_an_upload_at_the_size_cap(executing: Executing) -> None:
    data = os.urandom(CHUNK_GZIP_MAX)  # the server checks size and hash, not the gzip inside
    assert executing.upload(0, data) == 201
    assert get_storage().get(executing.run.id, 0) == data


@pytest.mark.parametrize("body", ["shorter", "longer", "same size, other bytes"])
def test_it_refuses_a_body_that_is_not_what_the_url_was_issued_for(executing: Executing, body: str) -> None:
    data = gz("expected content\n")
    url = executing.handout(0, data).json()["url"]
    sent = {
        "shorter": data[:-1],
        "longer": data + b"x",
        "same size, other bytes": data[:-1] + bytes([data[-1] ^ 0xFF]),
    }[body]
    answer = _put_local(url, sent)
    assert answer.status_code == 400, answer.content
    assert get_storage().get(executing.run.id, 0) is None


def test_it_refuses_a_forged_or_expired_upload_url(executing: Executing) -> None:
    data = gz("x")
    url = executing.handout(0, data).json()["url"]
    forged = url[:-3] + ("abc" if not url.endswith("abc") else "xyz")
    assert _put_local(forged, data).status_code == 401
    with time_machine.travel(timezone.now() + timedelta(seconds=UPLOAD_URL_TTL + 5)):
        answer = _put_local(url, data)
    assert answer.status_code == 401
    assert answer.json()["code"] == "upload_url_invalid"
    assert get_storage().get(executing.run.id, 0) is None


def test_it_refuses_a_local_upload_once_s3_is_configured(executing: Executing, s3: Any) -> None:
    data = gz("x")
    with override_settings(GANTRY_S3_BUCKET=""):
        url = executing.handout(0, data).json()["url"]
    assert _put_local(url, data).status_code == 404


# ---------------------------------------------------------------- the handout's guards


@pytest.mark.parametrize(
    ("n", "body"),
    [
        (MAX_CHUNKS, {"sha256": "a" * 64, "size": 10}),
        (0, {"sha256": "a" * 63, "size": 10}),
        (0, {"sha256": "g" * 64, "size": 10}),
        (0, {"sha256": "a" * 64, "size": 0}),
        (0, {"sha256": "a" * 64, "size": CHUNK_GZIP_MAX + 1}),
        (0, {"size": 10}),
    ],
)
def test_it_refuses_a_malformed_handout_request(executing: Executing, n: int, body: dict[str, Any]) -> None:
    answer = executing.api.post(f"/api/v1/runs/{executing.run.id}/logs/chunks/{n}", body, format="json")
    assert answer.status_code == 400, answer.content


def test_it_hands_out_urls_only_while_the_run_executes(executing: Executing) -> None:
    data = gz("x")
    executing.advance("request_cancel")
    assert executing.handout(0, data).status_code == 200  # still executing: the final chunk must get out
    executing.advance("ack")
    assert executing.handout(1, data).status_code == 200
    executing.advance("finish_cancelled")
    answer = executing.handout(2, data)
    assert answer.status_code == 409
    assert answer.json()["code"] == "run_terminal"


def test_it_refuses_a_run_not_yet_accepted(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned")
    assert d.runner is not None
    api = bearer(tokens.mint_runner_token(runner_id=d.runner.id, run_id=d.run.id, group_id=group.id))
    answer = api.post(f"/api/v1/runs/{d.run.id}/logs/chunks/0", {"sha256": "a" * 64, "size": 5}, format="json")
    assert answer.status_code == 409
    assert answer.json()["code"] == "conflict"


def test_it_refuses_a_token_of_another_run(executing: Executing) -> None:
    answer = executing.api.post(
        f"/api/v1/runs/{uuid.uuid4()}/logs/chunks/0", {"sha256": "a" * 64, "size": 5}, format="json"
    )
    assert answer.status_code == 403
    assert answer.json()["code"] == "run_binding"


def test_it_refuses_users(executing: Executing, teammate_api: APIClient) -> None:
    answer = teammate_api.post(
        f"/api/v1/runs/{executing.run.id}/logs/chunks/0", {"sha256": "a" * 64, "size": 5}, format="json"
    )
    assert answer.status_code == 403


# ---------------------------------------------------------------- S3 (moto server)


def test_it_hands_out_an_s3_presigned_put_that_stores_the_chunk(executing: Executing, s3: Any) -> None:
    data = gz("to S3\n")
    put = executing.handout(7, data).json()
    assert put["url"].startswith("http://127.0.0.1:")
    assert f"/{BUCKET}/runs/{executing.run.id}/chunks/00000007.gz?" in put["url"]
    assert put["headers"]["If-None-Match"] == "*"
    assert "x-amz-checksum-sha256" in put["headers"]

    status, _ = http_put(put["url"], data, put["headers"])
    assert status == 200
    stored = s3.get_object(Bucket=BUCKET, Key=f"runs/{executing.run.id}/chunks/00000007.gz")["Body"].read()
    assert stored == data


def test_it_keeps_the_first_s3_upload(executing: Executing, s3: Any) -> None:
    first = gz("first\n")
    put = executing.handout(0, first).json()
    assert http_put(put["url"], first, put["headers"])[0] == 200
    # The retry (or anyone else) meets the conditional write: 412, nothing replaced.
    assert http_put(put["url"], first, put["headers"])[0] == 412
    other = gz("second\n")
    put2 = executing.handout(0, other).json()
    assert http_put(put2["url"], other, put2["headers"])[0] == 412
    assert s3.get_object(Bucket=BUCKET, Key=f"runs/{executing.run.id}/chunks/00000000.gz")["Body"].read() == first


def test_it_puts_gets_and_probes_through_the_s3_storage(s3: Any) -> None:
    storage = get_storage()
    assert isinstance(storage, S3Storage)
    run_id = uuid.uuid4()
    assert storage.get(run_id, 0) is None
    assert not storage.exists(run_id, 0)
    assert storage.put(run_id, 0, b"one") is True
    assert storage.put(run_id, 0, b"two") is False
    assert storage.get(run_id, 0) == b"one"
    assert storage.exists(run_id, 0)


def test_it_applies_the_s3_prefix(executing: Executing, s3: Any) -> None:
    with override_settings(GANTRY_S3_PREFIX="/gantry/prod/"):
        storage = get_storage()
        assert storage.put(executing.run.id, 1, b"x")
    assert s3.get_object(Bucket=BUCKET, Key=f"gantry/prod/runs/{executing.run.id}/chunks/00000001.gz")


def test_the_handout_hash_is_what_the_runner_computes(executing: Executing, s3: Any) -> None:
    import base64

    data = gz("checksum\n")
    put = executing.handout(0, data).json()
    assert base64.b64decode(put["headers"]["x-amz-checksum-sha256"]).hex() == sha(data)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_concurrent_writers_of_one_chunk_leave_exactly_one(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "s3":
        request.getfixturevalue("s3")
    storage = get_storage()
    run_id = uuid.uuid4()
    bodies = [f"writer {i}\n".encode() * 1000 for i in range(8)]
    barrier = threading.Barrier(len(bodies))

    def write(body: bytes) -> bool:
        barrier.wait()
        return storage.put(run_id, 0, body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        won = list(pool.map(write, bodies))
    assert won.count(True) == 1
    assert storage.get(run_id, 0) == bodies[won.index(True)]
