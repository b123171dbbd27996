"""``manage.py create_log_bucket``: docker-compose.yml's one-shot that makes the bucket sealed logs go to.

Against moto's S3 server (a real HTTP endpoint), through the same client the storage uses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from tests.ports import free_port


@pytest.fixture
def fresh_bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Settings naming a bucket that does not exist yet on the moto server."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    name = f"gantry-logs-{uuid.uuid4().hex[:12]}"
    with override_settings(
        GANTRY_S3_BUCKET=name,
        GANTRY_S3_ENDPOINT_URL=moto_endpoint,
        GANTRY_S3_REGION="eu-west-1",  # not us-east-1: the create must name the region
        GANTRY_S3_ADDRESSING_STYLE="path",
    ):
        yield name


def _run() -> str:
    out = StringIO()
    call_command("create_log_bucket", stdout=out)
    return out.getvalue().strip()


def test_it_creates_the_bucket_once_and_leaves_it_after(fresh_bucket: str, moto_endpoint: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="eu-west-1")
    assert fresh_bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]

    assert _run() == f"log bucket {fresh_bucket!r} created"
    assert client.get_bucket_location(Bucket=fresh_bucket)["LocationConstraint"] == "eu-west-1"
    client.put_object(Bucket=fresh_bucket, Key="runs/kept", Body=b"x")

    # Run again (every `docker compose up` does): nothing changes, the object stays.
    assert _run() == f"log bucket {fresh_bucket!r} exists"
    assert client.get_object(Bucket=fresh_bucket, Key="runs/kept")["Body"].read() == b"x"


def test_it_refuses_without_a_bucket_name() -> None:
    with override_settings(GANTRY_S3_BUCKET=""), pytest.raises(CommandError, match="GANTRY_S3_BUCKET is not set"):
        _run()


def test_it_says_in_one_line_when_the_endpoint_does_not_answer(fresh_bucket: str) -> None:
    # A loopback port nothing listens on; a fresh client (the storage caches one per endpoint).
    with (
        override_settings(GANTRY_S3_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}"),
        pytest.raises(CommandError, match=f"could not create the log bucket '{fresh_bucket}'") as raised,
    ):
        _run()
    assert "\n" not in str(raised.value)
