"""``s3://bucket/prefix``: blobs as objects in any S3-compatible store (boto3).

The client is created lazily from settings (endpoint, region, credentials).
A put first streams the bytes into a spool file on local disk (one chunk in
memory at a time), hashing them, and runs the caller's ``before_commit``
check, so a refused or cut-off stream never reaches S3. Then the spool goes
up in one ``PutObject`` (up to ``single_put_max``) or as a multipart upload
whose parts are read from the spool (at most ``parts_in_flight`` parts in
memory). Put-if-absent is ``If-None-Match: *`` (with a head check first for
servers that ignore it); a failed multipart upload is aborted.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from services.common.blobstore.port import BlobInfo, BlobStore, validate_key, write_hashed
from services.common.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable

PART_SIZE = 8 * 1024 * 1024
"""Multipart part size; S3 requires >= 5 MiB for every part but the last."""
SINGLE_PUT_MAX = 1024 * 1024 * 1024
"""Blobs up to this size go up in one PutObject (S3 allows 5 GiB): fewer round trips than parts."""

_MISSING = {"404", "NoSuchKey", "NotFound"}
_EXISTS = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


def _code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3BlobStore(BlobStore):
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region_name: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, part_size: int = PART_SIZE,
                 parts_in_flight: int = 4, single_put_max: int = SINGLE_PUT_MAX,
                 spool_dir: str | None = None) -> None:
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
        self.single_put_max = min(max(single_put_max, 0), 5 * 1024 * 1024 * 1024)
        self.spool_dir = spool_dir
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

    def put(self, key: str, chunks: Iterable[bytes],
            before_commit: Callable[[BlobInfo], None] | None = None) -> BlobInfo:
        from botocore.exceptions import BotoCoreError, ClientError

        object_key = self._object_key(key)
        if self._head(object_key) is not None:
            raise AlreadyExists(f"blob {key!r} already exists", reason="BLOB_EXISTS")
        if self.spool_dir is not None:
            Path(self.spool_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(prefix="engram-s3-", dir=self.spool_dir) as spool:
            info = write_hashed(key, chunks, spool, before_commit)
            size = info.size_bytes
            spool.flush()
            try:
                if size <= self.single_put_max:
                    spool.seek(0)
                    stored = self.client.put_object(Bucket=self.bucket, Key=object_key,
                                                    Body=spool, ContentLength=size,
                                                    IfNoneMatch="*")
                else:
                    stored = self._multipart(object_key, spool.fileno(), size)
            except ClientError as error:
                if _code(error) in _EXISTS:
                    raise AlreadyExists(f"blob {key!r} already exists",
                                        reason="BLOB_EXISTS") from None
                raise self._unavailable(error, "put") from error
            except BotoCoreError as error:
                raise self._unavailable(error, "put") from error
        return replace(info, version=stored.get("ETag"))

    def _multipart(self, object_key: str, spool_fd: int, size: int) -> dict[str, Any]:
        """Parts read from the spool file; at most ``parts_in_flight`` of them in memory."""
        upload_id = self.client.create_multipart_upload(
            Bucket=self.bucket, Key=object_key)["UploadId"]
        pool = ThreadPoolExecutor(self.parts_in_flight, thread_name_prefix="s3-part")
        try:
            parts = [pool.submit(self._upload_part, object_key, upload_id, number, spool_fd,
                                 offset, min(self.part_size, size - offset))
                     for number, offset in enumerate(range(0, size, self.part_size), 1)]
            done = [part.result() for part in parts]
            completed: dict[str, Any] = self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=object_key, UploadId=upload_id,
                MultipartUpload={"Parts": done}, IfNoneMatch="*")
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            self._abort(object_key, upload_id)
            raise
        pool.shutdown(wait=True)
        return completed

    def _upload_part(self, object_key: str, upload_id: str, number: int, spool_fd: int,
                     offset: int, length: int) -> dict[str, Any]:
        body = os.pread(spool_fd, length, offset)
        reply = self.client.upload_part(Bucket=self.bucket, Key=object_key,
                                        UploadId=upload_id, PartNumber=number, Body=body)
        return {"PartNumber": number, "ETag": reply["ETag"]}

    def _abort(self, object_key: str, upload_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        # An unfinished upload is invisible; bucket lifecycle rules reclaim what abort misses.
        with contextlib.suppress(BotoCoreError, ClientError):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=object_key,
                                               UploadId=upload_id)

    def _head(self, object_key: str) -> dict[str, Any] | None:
        """The object's HEAD answer, or None when there is none."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=object_key)
            return head
        except ClientError as error:
            if _code(error) in _MISSING:
                return None
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
        return self._head(self._object_key(key)) is not None

    def version(self, key: str) -> str | None:
        """The object's ETag: the MD5 of its bytes (of its parts' for a multipart put), so
        another put of other bytes has another one."""
        head = self._head(self._object_key(key))
        if head is None:
            raise NotFound(f"blob {key!r} not found in {self.url}", reason="BLOB_NOT_FOUND")
        etag: str | None = head.get("ETag")
        return etag

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._object_key(key))
        except (BotoCoreError, ClientError) as error:
            raise self._unavailable(error, "delete") from error

    def purge(self, key: str) -> None:
        """Every version and delete marker of the key (a versioned bucket keeps the bytes of
        a deleted object as a noncurrent version otherwise); an unversioned bucket has one."""
        from botocore.exceptions import BotoCoreError, ClientError

        name = self._object_key(key)
        try:
            # The plain delete first: on a versioned bucket S3 answers it with a new delete
            # marker named by the key (an artifact's name is in it, and may be erased text),
            # which the sweep below then removes with the versions. Sent after the sweep (as
            # before 2026-11-30), it left that marker behind.
            self.client.delete_object(Bucket=self.bucket, Key=name)
            for found, version in self._versions(name):
                if found == name:
                    self.client.delete_object(Bucket=self.bucket, Key=name, VersionId=version)
        except (BotoCoreError, ClientError) as error:
            raise self._unavailable(error, "purge") from error

    def purge_prefix(self, prefix: str) -> int:
        """Every version and delete marker under the prefix: a key deleted before (a retired
        snapshot, an old index file) keeps noncurrent versions that ``list`` does not show."""
        from botocore.exceptions import BotoCoreError, ClientError

        current = len(list(self.list(prefix)))
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            for found, version in self._versions(base + prefix):
                self.client.delete_object(Bucket=self.bucket, Key=found, VersionId=version)
        except (BotoCoreError, ClientError) as error:
            raise self._unavailable(error, "purge") from error
        return current

    def _versions(self, object_prefix: str) -> Iterator[tuple[str, str]]:
        """(object key, version id) of every version and delete marker under the prefix."""
        paginator = self.client.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=object_prefix):
            for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                yield str(entry["Key"]), str(entry["VersionId"])

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
