"""``s3://bucket/prefix``: blobs as objects in any S3-compatible store (boto3).

The client is created lazily from settings (endpoint, region, credentials).
Small blobs go up in one ``PutObject``; larger ones stream as a multipart
upload (two parts in flight), so no blob is ever held whole in memory. Put-if-absent is
``If-None-Match: *`` (with a head check first for servers that ignore it);
an interrupted upload is aborted, so nothing partial becomes visible.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from services.common.blobstore.port import BlobInfo, BlobStore, validate_key
from services.common.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable

PART_SIZE = 8 * 1024 * 1024
"""Multipart part size; S3 requires >= 5 MiB for every part but the last."""

_MISSING = {"404", "NoSuchKey", "NotFound"}
_EXISTS = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


def _code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3BlobStore(BlobStore):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region_name: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, part_size: int = PART_SIZE,
                 parts_in_flight: int = 2) -> None:
        if not bucket:
            raise InvalidArgument("an s3:// blob URL needs a bucket: s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client_options: dict[str, Any] = {
            k: v for k, v in {
                "endpoint_url": endpoint_url, "region_name": region_name,
                "aws_access_key_id": access_key_id, "aws_secret_access_key": secret_access_key,
            }.items() if v
        }
        self.part_size = max(part_size, 5 * 1024 * 1024)
        self.parts_in_flight = max(1, parts_in_flight)
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3BlobStore:
        parsed = urlparse(url)
        if parsed.scheme != "s3":
            raise InvalidArgument(f"not an S3 URL: {url!r} (use s3://bucket/prefix)")
        return cls(parsed.netloc, parsed.path, **options)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3
                    from botocore.config import Config

                    # SHA-256 is computed here already; skip botocore's extra body checksums.
                    config = Config(retries={"max_attempts": 3, "mode": "standard"},
                                    max_pool_connections=32,
                                    request_checksum_calculation="when_required",
                                    response_checksum_validation="when_required")
                    self._client = boto3.session.Session().client(
                        "s3", config=config, **self._client_options)
        return self._client

    def _object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _unavailable(self, error: Exception, action: str) -> Unavailable:
        return Unavailable(f"S3 {action} on {self.url} failed: {error}",
                           reason="BLOB_STORE_UNAVAILABLE")

    def put(self, key: str, chunks: Iterable[bytes]) -> BlobInfo:
        from botocore.exceptions import BotoCoreError, ClientError

        object_key = self._object_key(key)
        if self._head(object_key):
            raise AlreadyExists(f"blob {key!r} already exists", reason="BLOB_EXISTS")
        digest = hashlib.sha256()
        size = 0
        pending: list[bytes] = []
        pending_size = 0
        upload_id: str | None = None
        parts: list[Future[dict[str, Any]]] = []
        in_flight = threading.BoundedSemaphore(self.parts_in_flight)
        pool: ThreadPoolExecutor | None = None
        try:
            for chunk in chunks:
                digest.update(chunk)
                size += len(chunk)
                pending.append(chunk)
                pending_size += len(chunk)
                if pending_size >= self.part_size:
                    if upload_id is None:
                        upload_id = self.client.create_multipart_upload(
                            Bucket=self.bucket, Key=object_key)["UploadId"]
                        pool = ThreadPoolExecutor(self.parts_in_flight,
                                                  thread_name_prefix="s3-part")
                    assert pool is not None
                    in_flight.acquire()  # bounds memory: at most N parts buffered at once
                    parts.append(pool.submit(self._upload_part, object_key, upload_id,
                                             len(parts) + 1, b"".join(pending), in_flight))
                    pending, pending_size = [], 0
            if upload_id is None:
                self.client.put_object(Bucket=self.bucket, Key=object_key,
                                       Body=b"".join(pending), IfNoneMatch="*")
            else:
                assert pool is not None
                if pending:
                    in_flight.acquire()
                    parts.append(pool.submit(self._upload_part, object_key, upload_id,
                                             len(parts) + 1, b"".join(pending), in_flight))
                done = [part.result() for part in parts]
                self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=object_key, UploadId=upload_id,
                    MultipartUpload={"Parts": done}, IfNoneMatch="*")
                upload_id = None
        except ClientError as error:
            if _code(error) in _EXISTS:
                raise AlreadyExists(f"blob {key!r} already exists", reason="BLOB_EXISTS") from None
            raise self._unavailable(error, "put") from error
        except BotoCoreError as error:
            raise self._unavailable(error, "put") from error
        finally:
            if pool is not None:
                for part in parts:
                    part.cancel()
                pool.shutdown(wait=True)
            if upload_id is not None:
                self._abort(object_key, upload_id)
        return BlobInfo(key=key, size_bytes=size, sha256=digest.hexdigest())

    def _upload_part(self, object_key: str, upload_id: str, number: int, body: bytes,
                     in_flight: threading.BoundedSemaphore) -> dict[str, Any]:
        try:
            reply = self.client.upload_part(Bucket=self.bucket, Key=object_key,
                                            UploadId=upload_id, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": reply["ETag"]}
        finally:
            in_flight.release()

    def _abort(self, object_key: str, upload_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        # An unfinished upload is invisible; bucket lifecycle rules reclaim what abort misses.
        with contextlib.suppress(BotoCoreError, ClientError):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=object_key,
                                               UploadId=upload_id)

    def _head(self, object_key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=object_key)
            return True
        except ClientError as error:
            if _code(error) in _MISSING:
                return False
            raise self._unavailable(error, "head") from error
        except BotoCoreError as error:
            raise self._unavailable(error, "head") from error

    def open(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError, ClientError

        object_key = self._object_key(key)
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=object_key)["Body"]
        except ClientError as error:
            if _code(error) in _MISSING:
                raise NotFound(f"blob {key!r} not found in {self.url}",
                               reason="BLOB_NOT_FOUND") from None
            raise self._unavailable(error, "get") from error
        except BotoCoreError as error:
            raise self._unavailable(error, "get") from error
        return self._read(body, chunk_size)

    def _read(self, body: Any, chunk_size: int) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError

        try:
            yield from body.iter_chunks(chunk_size)
        except BotoCoreError as error:
            raise self._unavailable(error, "read") from error
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        return self._head(self._object_key(key))

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._object_key(key))
        except (BotoCoreError, ClientError) as error:
            raise self._unavailable(error, "delete") from error

    def list(self, prefix: str = "") -> Iterator[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        base = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                for item in page.get("Contents", []):
                    yield str(item["Key"])[len(base):]
        except (BotoCoreError, ClientError) as error:
            raise self._unavailable(error, "list") from error

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
