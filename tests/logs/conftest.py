"""Fixtures for the log tests: a run executing on a runner, local and S3 storage.

Every test gets its own local log folder. S3 is moto in server mode (a real
HTTP endpoint in a thread), so boto3's presigned URLs are PUT to over the
network exactly as a runner would.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from gantry.core import tokens
from gantry.core.models import Run, Runner, RunnerGroup, Stack
from gantry.logs import live
from gantry.logs.reader import INDEX_KEY
from gantry.redis import client as redis_client

from ..core.drive import Driven, advance, drive

BUCKET = "gantry-logs"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a slower test (seconds, not milliseconds)")


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def gz(data: bytes | str) -> bytes:
    # mtime=0: gzip stamps the current second into its header, so two calls for the same text a second
    # boundary apart gave different bytes (and hashes), and a test comparing them failed now and then.
    return gzip.compress(data.encode() if isinstance(data, str) else data, mtime=0)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Executing:
    """A run executing on its runner, and that runner's API client."""

    run: Run
    runner: Runner
    api: APIClient
    group: RunnerGroup
    driven: Driven

    def push(self, chunk_index: int, sealed_chunks: int, text: bytes | str) -> Any:
        import base64

        body = {"chunk_index": chunk_index, "sealed_chunks": sealed_chunks, "data": base64.b64encode(gz(text)).decode()}
        return self.api.post(f"/api/v1/runs/{self.run.id}/logs/live", body, format="json")

    def handout(self, n: int, data: bytes) -> Any:
        body = {"sha256": sha(data), "size": len(data)}
        return self.api.post(f"/api/v1/runs/{self.run.id}/logs/chunks/{n}", body, format="json")

    def upload(self, n: int, data: bytes) -> int:
        """Seal chunk ``n`` as a runner does: ask for the URL, PUT the bytes there; answers the PUT's status."""
        handout = self.handout(n, data)
        assert handout.status_code == 200, handout.content
        put = handout.json()
        if put["url"].startswith("http://testserver/"):
            answer = APIClient().generic("PUT", put["url"], data, **_django_headers(put["headers"]))
            return int(answer.status_code)
        return http_put(put["url"], data, put["headers"])[0]

    def seal_one(self, n: int, text: bytes | str) -> str:
        data = gz(text)
        assert self.upload(n, data) in (200, 201)
        return sha(data)

    def seal(self, chunks: list[bytes | str]) -> list[str]:
        """Upload each text as the next chunk (gzipped); answers their hashes, as the manifest lists them."""
        return [self.seal_one(n, text) for n, text in enumerate(chunks)]

    def done(self, hashes: list[str], outcome: str = "succeeded", **extra: Any) -> Any:
        body = {
            "outcome": outcome,
            "exit_code": 0,
            "sealed_chunks": len(hashes),
            "manifest": {"count": len(hashes), "sha256": hashes},
            **extra,
        }
        return self.api.post(f"/api/v1/runs/{self.run.id}/done", body, format="json")

    def advance(self, *steps: str) -> None:
        self.driven = advance(self.driven, self.group, list(steps))
        self.run = self.driven.run


@pytest.fixture
def executing(stack: Stack, group: RunnerGroup) -> Executing:
    d = drive(stack, group, "running")
    assert d.runner is not None
    token = tokens.mint_runner_token(runner_id=d.runner.id, run_id=d.run.id, group_id=group.id)
    return Executing(run=d.run, runner=d.runner, api=bearer(token), group=group, driven=d)


@pytest.fixture(autouse=True)
def log_dir(tmp_path: Path) -> Iterator[Path]:
    """Local storage in a folder of the test's own (and S3 off unless a test asks for it)."""
    folder = tmp_path / "logs"
    with override_settings(GANTRY_LOG_DIR=str(folder), GANTRY_S3_BUCKET=""):
        yield folder


@pytest.fixture(autouse=True)
def redis_leftovers(db: None) -> Iterator[None]:
    """Drop the Redis keys of the test's runs (the test database goes, Redis stays)."""
    yield
    keys = [
        k.format(run_id=run_id) for run_id in Run.objects.values_list("id", flat=True) for k in (live.KEY, INDEX_KEY)
    ]
    if keys:
        redis_client().delete(*keys)


def _django_headers(headers: dict[str, str]) -> dict[str, str]:
    out = {}
    for name, value in headers.items():
        if name.lower() == "content-type":
            out["content_type"] = value
        else:
            out["HTTP_" + name.upper().replace("-", "_")] = value
    return out


def http_put(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """A real HTTP PUT (what a runner does with a presigned S3 URL)."""
    request = urllib.request.Request(url, data=data, method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """S3 storage on the moto server: settings point at it, the bucket exists; answers a boto3 client."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    with override_settings(
        GANTRY_S3_BUCKET=BUCKET,
        GANTRY_S3_ENDPOINT_URL=moto_endpoint,
        GANTRY_S3_REGION="us-east-1",
        GANTRY_S3_ADDRESSING_STYLE="path",
    ):
        yield client
