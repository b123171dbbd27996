"""Where sealed chunks live: S3 (through boto3) when ``GANTRY_S3_BUCKET`` is set, else a local folder.

Both sit behind one interface. A chunk is written **at most once**: ``put``
refuses to replace an existing object (S3 conditional write ``If-None-Match:
*``; locally an exclusive hard link), and so does the upload URL a runner is
handed. That is what makes a retried upload harmless and what lets the
reaper's flush race a lost runner's last upload safely: whichever lands first
stays.

Calls here may be slow (network round trips to S3): never make them inside a
database transaction.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing
from django.urls import reverse
from django.utils import timezone

from gantry import embedded
from gantry.logs.limits import UPLOAD_URL_TTL

UPLOAD_SALT = "gantry.logs.upload"
# Keys per S3 DeleteObjects request (the API's maximum).
S3_DELETE_BATCH = 1000
# HTTP connections the shared S3 client keeps.
S3_CONNECTIONS = 32


def chunk_key(run_id: uuid.UUID, n: int) -> str:
    """The object key of chunk ``n`` (the contract's name, under the storage's root or prefix)."""
    return f"runs/{run_id}/chunks/{n:08d}.gz"


def times_key(run_id: uuid.UUID, n: int) -> str:
    """The object key of chunk ``n``'s time marks (docs/logs.md, "Line times"): beside the chunks, not among them."""
    return f"runs/{run_id}/times/{n:08d}.json"


def encode_times(marks: list[list[int]]) -> bytes:
    return json.dumps(marks, separators=(",", ":")).encode()


def decode_times(raw: bytes | None) -> list[list[int]] | None:
    """Stored marks, or None when absent or unreadable (times are an aid; the log reads the same without)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if type(value) is not list or not all(
        type(m) is list and len(m) == 2 and all(type(x) is int for x in m) for m in value
    ):
        return None
    return value


@dataclass(frozen=True)
class PresignedPut:
    url: str
    headers: dict[str, str]
    expires_at: datetime
    method: str = "PUT"

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "method": self.method, "headers": self.headers, "expires_at": self.expires_at}


class LogStorage(ABC):
    @abstractmethod
    def put(self, run_id: uuid.UUID, n: int, data: bytes) -> bool:
        """Store chunk ``n`` unless it exists: True when written, False when something was already there."""

    @abstractmethod
    def get(self, run_id: uuid.UUID, n: int) -> bytes | None:
        """Chunk ``n``'s bytes, or None when storage has no such chunk."""

    @abstractmethod
    def exists(self, run_id: uuid.UUID, n: int) -> bool: ...

    @abstractmethod
    def presign_put(self, run_id: uuid.UUID, n: int, sha256: str, size: int) -> PresignedPut:
        """A URL the runner PUTs chunk ``n`` to; only a body of ``size`` bytes hashing to ``sha256`` is kept."""

    @abstractmethod
    def put_times(self, run_id: uuid.UUID, n: int, data: bytes) -> bool:
        """Store chunk ``n``'s time marks unless they exist (write-once, as the chunk): True when written."""

    @abstractmethod
    def get_times(self, run_id: uuid.UUID, n: int) -> bytes | None:
        """Chunk ``n``'s stored time marks, or None."""

    @abstractmethod
    def delete_runs(self, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Exception]:
        """Delete every stored chunk of these runs (retention); answers the runs whose delete failed, with why.

        Idempotent: a run with nothing stored (or already deleted) succeeds.
        """


# ---------------------------------------------------------------- local folder


@dataclass(frozen=True)
class UploadGrant:
    """What a signed local upload URL allows: one chunk of one run, with this hash and size."""

    run_id: uuid.UUID
    n: int
    sha256: str
    size: int


class LocalStorage(LogStorage):
    """Chunks as files under ``root`` (``GANTRY_LOG_DIR``), uploaded through Gantry's own signed URL."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, run_id: uuid.UUID, n: int) -> Path:
        return self.root / chunk_key(run_id, n)

    def put(self, run_id: uuid.UUID, n: int, data: bytes) -> bool:
        return self._put_once(self.path(run_id, n), data)

    def put_times(self, run_id: uuid.UUID, n: int, data: bytes) -> bool:
        return self._put_once(self.root / times_key(run_id, n), data)

    def get_times(self, run_id: uuid.UUID, n: int) -> bytes | None:
        try:
            return (self.root / times_key(run_id, n)).read_bytes()
        except FileNotFoundError:
            return None

    @staticmethod
    def _put_once(final: Path, data: bytes) -> bool:
        final.parent.mkdir(parents=True, exist_ok=True)
        # Write a temporary file in the same folder, then link it into place:
        # link() is atomic and fails when the name exists, so a reader never
        # sees a half-written chunk and a second writer never replaces the first.
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".upload-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, final)
            except FileExistsError:
                return False
            return True
        finally:
            os.unlink(tmp)

    def get(self, run_id: uuid.UUID, n: int) -> bytes | None:
        try:
            return self.path(run_id, n).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, run_id: uuid.UUID, n: int) -> bool:
        return self.path(run_id, n).is_file()

    def delete_runs(self, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Exception]:
        failed: dict[uuid.UUID, Exception] = {}
        for run_id in run_ids:
            try:
                shutil.rmtree(self.root / "runs" / str(run_id))
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed[run_id] = exc
        return failed

    def presign_put(self, run_id: uuid.UUID, n: int, sha256: str, size: int) -> PresignedPut:
        token = signing.dumps({"r": str(run_id), "n": n, "h": sha256, "z": size}, salt=UPLOAD_SALT, compress=False)
        # A path: the view makes it absolute with the host the runner called.
        return PresignedPut(
            url=reverse("log_upload", kwargs={"token": token}),
            headers={"Content-Type": "application/gzip"},
            expires_at=timezone.now() + timedelta(seconds=UPLOAD_URL_TTL),
        )

    @staticmethod
    def verify_upload_token(token: str) -> UploadGrant:
        """The grant inside a signed upload URL; raises ``signing.BadSignature`` (or its subclass
        ``SignatureExpired``) when the token is forged or older than ``UPLOAD_URL_TTL``."""
        raw = signing.loads(token, salt=UPLOAD_SALT, max_age=UPLOAD_URL_TTL)
        try:
            return UploadGrant(run_id=uuid.UUID(raw["r"]), n=int(raw["n"]), sha256=str(raw["h"]), size=int(raw["z"]))
        except (KeyError, TypeError, ValueError):
            raise signing.BadSignature("malformed upload grant") from None


# ---------------------------------------------------------------- S3


class S3Storage(LogStorage):
    def __init__(self, *, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = client

    def key(self, run_id: uuid.UUID, n: int) -> str:
        return self.prefix + chunk_key(run_id, n)

    def put(self, run_id: uuid.UUID, n: int, data: bytes) -> bool:
        return self._put_once(self.key(run_id, n), data, "application/gzip")

    def put_times(self, run_id: uuid.UUID, n: int, data: bytes) -> bool:
        return self._put_once(self.prefix + times_key(run_id, n), data, "application/json")

    def _put_once(self, key: str, data: bytes, content_type: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type, IfNoneMatch="*")
        except ClientError as exc:
            if _status(exc) == 412:  # PreconditionFailed: the key exists
                return False
            raise
        return True

    def get(self, run_id: uuid.UUID, n: int) -> bytes | None:
        return self._get(self.key(run_id, n))

    def get_times(self, run_id: uuid.UUID, n: int) -> bytes | None:
        return self._get(self.prefix + times_key(run_id, n))

    def _get(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        body: bytes = answer["Body"].read()
        return body

    def exists(self, run_id: uuid.UUID, n: int) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(run_id, n))
        except ClientError as exc:
            if _status(exc) == 404:
                return False
            raise
        return True

    def delete_runs(self, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Exception]:
        """One LIST per run (a lost runner may have stored chunks its manifest does not name), then
        DeleteObjects in batches of up to 1,000 keys; a key S3 reports as not deleted fails its run."""
        failed: dict[uuid.UUID, Exception] = {}
        keys: list[tuple[str, uuid.UUID]] = []

        def listing(run_id: uuid.UUID) -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{self.prefix}runs/{run_id}/"
            )
            return [item["Key"] for page in pages for item in page.get("Contents", ())]

        # The LISTs are round trips each: a few at once (the client is thread-safe).
        with ThreadPoolExecutor(max_workers=max(1, min(S3_CONNECTIONS // 2, len(run_ids)))) as pool:
            listed = {run_id: pool.submit(listing, run_id) for run_id in run_ids}
        for run_id, future in listed.items():
            error = future.exception()
            if error is not None:
                failed[run_id] = error if isinstance(error, Exception) else RuntimeError(str(error))
            else:
                keys.extend((key, run_id) for key in future.result())
        owner = dict(keys)
        for start in range(0, len(keys), S3_DELETE_BATCH):
            batch = keys[start : start + S3_DELETE_BATCH]
            try:
                answer = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": key} for key, _ in batch], "Quiet": True}
                )
            except Exception as exc:
                for _, run_id in batch:
                    failed[run_id] = exc
                continue
            for error in answer.get("Errors", ()):
                run_id = owner[error["Key"]]
                failed[run_id] = OSError(
                    f"S3 did not delete {error['Key']}: {error.get('Code')} {error.get('Message')}"
                )
        return failed

    def presign_put(self, run_id: uuid.UUID, n: int, sha256: str, size: int) -> PresignedPut:
        checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
        # Every one of these is a signed header: S3 refuses the PUT unless the
        # body is exactly `size` bytes hashing to `sha256`, and (If-None-Match)
        # unless the key is still free, so a chunk is written once.
        url = self.client.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": self.key(run_id, n),
                "ContentType": "application/gzip",
                "ContentLength": size,
                "ChecksumSHA256": checksum,
                "IfNoneMatch": "*",
            },
            ExpiresIn=UPLOAD_URL_TTL,
            HttpMethod="PUT",
        )
        return PresignedPut(
            url=url,
            headers={
                "Content-Type": "application/gzip",
                "x-amz-checksum-sha256": checksum,
                "If-None-Match": "*",
            },
            expires_at=timezone.now() + timedelta(seconds=UPLOAD_URL_TTL),
        )


def _status(exc: Any) -> int | None:
    meta = exc.response.get("ResponseMetadata", {})
    status = meta.get("HTTPStatusCode")
    return int(status) if status is not None else None


@functools.cache
def _s3_client(endpoint_url: str, region: str, addressing_style: str) -> Any:
    import boto3
    from botocore.config import Config

    # Credentials come from boto3's usual chain (AWS_* variables, profiles,
    # instance roles); only what boto3 cannot guess is a Gantry setting.
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url or None,
        region_name=region or None,
        # Enough connections for the reapers' flush threads (gantry.logs.services.FLUSH_THREADS)
        # and the retention purge to run their requests at once; botocore's default is 10.
        config=Config(
            signature_version="s3v4", s3={"addressing_style": addressing_style}, max_pool_connections=S3_CONNECTIONS
        ),
    )


def create_bucket() -> bool:
    """Create the bucket ``GANTRY_S3_BUCKET`` names if it is missing; answer whether this call created it.

    For a one-shot set-up step (``manage.py create_log_bucket``, docker-compose.yml's
    ``createbucket``), so it must be safe to run again: an existing bucket is left
    as it is. Raises botocore's errors (no endpoint, refused credentials, a name
    another account holds).
    """
    from botocore.exceptions import ClientError

    bucket: str = settings.GANTRY_S3_BUCKET
    region: str = settings.GANTRY_S3_REGION
    client = _s3_client(settings.GANTRY_S3_ENDPOINT_URL, region, settings.GANTRY_S3_ADDRESSING_STYLE)
    # HEAD first: AWS's us-east-1 answers a repeated create with success, so the
    # create's answer alone cannot tell "made now" from "was there".
    try:
        client.head_bucket(Bucket=bucket)
        return False
    except ClientError as exc:
        if _status(exc) != 404:
            raise
    # us-east-1 is the one region S3 refuses as a LocationConstraint.
    options = {"CreateBucketConfiguration": {"LocationConstraint": region}} if region not in ("", "us-east-1") else {}
    try:
        client.create_bucket(Bucket=bucket, **options)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "BucketAlreadyOwnedByYou":  # a concurrent run made it
            return False
        raise
    return True


def get_storage() -> LogStorage:
    """The storage the settings name (built per call; the S3 client is shared)."""
    bucket: str = settings.GANTRY_S3_BUCKET
    if bucket:
        client = _s3_client(
            settings.GANTRY_S3_ENDPOINT_URL, settings.GANTRY_S3_REGION, settings.GANTRY_S3_ADDRESSING_STYLE
        )
        return S3Storage(bucket=bucket, prefix=settings.GANTRY_S3_PREFIX, client=client)
    root = settings.GANTRY_LOG_DIR
    return LocalStorage(Path(root) if root else embedded.data_dir() / "logs")
