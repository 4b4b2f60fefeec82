"""Byte integrity of artifacts: uploads checked as they stream in, reads and stored blobs
checked against the hash and size their row records."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from services.artifacts.domain.entities import Artifact, ArtifactProblem
from services.common.blobstore import BlobInfo
from services.common.errors import IntegrityError, InvalidArgument


@dataclass(frozen=True)
class ArtifactUpload:
    run_id: str
    step_id: str
    name: str
    mime_type: str = "application/octet-stream"
    metadata_json: str = ""
    expected_size_bytes: int | None = None
    expected_hash: str = ""


@dataclass(frozen=True)
class UploadEnd:
    """The client's end-of-upload marker: what it sent. Without it a stream is a truncation."""

    size_bytes: int
    sha256: str = ""


class CheckedUpload:
    """Passes chunks through and refuses, before anything is committed, a stream that is
    cut short, longer than declared, or whose bytes differ from the declared hash."""

    def __init__(self, upload: ArtifactUpload,
                 check_size: Callable[[int], None] = lambda _size: None) -> None:
        self.upload = upload
        self.end: UploadEnd | None = None
        self.check_size = check_size
        """Raises once an upload of this many bytes is over the service's cap."""
        if upload.expected_size_bytes is not None:
            check_size(upload.expected_size_bytes)

    def chunks(self, parts: Iterable[bytes | UploadEnd]) -> Iterator[bytes]:
        declared, size = self.upload.expected_size_bytes, 0
        for part in parts:
            if self.end is not None:
                raise InvalidArgument("the upload trailer must be the last message",
                                      reason="UPLOAD_MALFORMED")
            if isinstance(part, UploadEnd):
                self.end = part
                continue
            size += len(part)
            self.check_size(size)
            if declared is not None and size > declared:
                raise InvalidArgument(f"upload exceeds its declared {declared} bytes",
                                      reason="UPLOAD_SIZE_MISMATCH")
            yield part
        if self.end is None:
            raise InvalidArgument(
                f"upload ended after {size} bytes without its trailer (cancelled or cut off); "
                "nothing was stored", reason="UPLOAD_TRUNCATED")
        for expected in (declared, self.end.size_bytes):
            if expected is not None and size != expected:
                raise InvalidArgument(
                    f"upload ended after {size} of {expected} declared bytes (truncated); "
                    "nothing was stored", reason="UPLOAD_TRUNCATED")

    def check_hash(self, info: BlobInfo) -> None:
        trailer_hash = self.end.sha256 if self.end is not None else ""
        for expected in (self.upload.expected_hash, trailer_hash):
            if expected and info.sha256 != expected.lower():
                raise InvalidArgument("uploaded bytes do not match the declared SHA-256; "
                                      "nothing was stored", reason="UPLOAD_HASH_MISMATCH")


def verified_read(artifact: Artifact, stream: Iterator[bytes]) -> Iterator[bytes]:
    """The blob's chunks as they come; a mismatch raises IntegrityError at the end."""
    digest, size = hashlib.sha256(), 0
    for chunk in stream:
        size += len(chunk)
        if size > artifact.size_bytes:
            break
        digest.update(chunk)
        yield chunk
    if size != artifact.size_bytes or digest.hexdigest() != artifact.hash:
        raise _blob_error(artifact, f"bytes at {artifact.path} no longer match the stored hash "
                          "(altered or truncated); discard what was received",
                          "BLOB_HASH_MISMATCH")


def blob_missing_error(artifact: Artifact) -> IntegrityError:
    return _blob_error(artifact, f"its blob {artifact.path} is missing from the store",
                       "BLOB_MISSING")


def _blob_error(artifact: Artifact, what: str, reason: str) -> IntegrityError:
    return IntegrityError(f"artifact {artifact.artifact_id}: {what}", reason=reason,
                          metadata={"artifact_id": artifact.artifact_id, "path": artifact.path,
                                    "hash": artifact.hash})


def blob_missing_problem(artifact: Artifact) -> ArtifactProblem:
    return ArtifactProblem(artifact.artifact_id, artifact.path, "BLOB_MISSING", artifact.hash,
                           "", artifact.size_bytes, 0)


def blob_problem(artifact: Artifact, stream: Iterable[bytes]) -> ArtifactProblem | None:
    """What is wrong with the stored bytes in ``stream``, or ``None`` when they match."""
    digest, size = hashlib.sha256(), 0
    for chunk in stream:
        digest.update(chunk)
        size += len(chunk)
    actual = digest.hexdigest()
    if actual == artifact.hash and size == artifact.size_bytes:
        return None
    kind = "BLOB_SIZE_MISMATCH" if size != artifact.size_bytes else "BLOB_HASH_MISMATCH"
    return ArtifactProblem(artifact.artifact_id, artifact.path, kind, artifact.hash, actual,
                           artifact.size_bytes, size)
