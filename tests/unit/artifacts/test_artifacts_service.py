"""ArtifactsService over a real SQLite file and file:// store, with a flaky store for I/O faults."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from services.artifacts.domain.entities import Pointer, PointerType, RunStatus
from services.artifacts.domain.integrity import ArtifactUpload, UploadEnd
from services.artifacts.server import MIGRATIONS
from services.artifacts.service import ArtifactsService
from services.common.blobstore import BlobInfo, BlobStore
from services.common.blobstore.file import FileBlobStore
from services.common.db import Database
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound


class FlakyExists(BlobStore):
    """A real file store whose first ``misses`` existence checks fail (transient I/O)."""

    def __init__(self, inner: FileBlobStore, misses: int) -> None:
        self.inner = inner
        self.misses = misses

    def put(self, key: str, chunks: Iterable[bytes],
            before_commit: Callable[[BlobInfo], None] | None = None) -> BlobInfo:
        return self.inner.put(key, chunks, before_commit)

    def open(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return self.inner.open(key, chunk_size)

    def exists(self, key: str) -> bool:
        if self.misses > 0:
            self.misses -= 1
            return False
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        return self.inner.list(prefix)


def _service(tmp_path: Path, blobs: BlobStore) -> ArtifactsService:
    db = Database(f"sqlite:///{tmp_path / 'a.db'}")
    db.upgrade(MIGRATIONS)
    return ArtifactsService(db, blobs, retry_delay_s=0)


@pytest.mark.parametrize(("misses", "survives"), [(1, True), (2, False)])
def test_retry_once_covers_a_transient_miss_but_not_two(tmp_path: Path, misses: int,
                                                        survives: bool) -> None:
    flaky = FlakyExists(FileBlobStore(tmp_path / "blobs"), 0)
    service = _service(tmp_path, flaky)
    run, _ = service.start_run("fleet", "agent", "run-1")
    art = service.upload("fleet", ArtifactUpload("run-1", "s", "x"), [b"bytes", UploadEnd(5)])
    flaky.misses = misses
    pointer = Pointer(PointerType.ARTIFACT, art.artifact_id)
    if survives:
        assert service.resolve("fleet", "agent", run.run_id, pointer, critical=True).attempts == 2
        assert service.get_run("fleet", "run-1").status is RunStatus.RUNNING
    else:
        with pytest.raises(NotFound):
            service.resolve("fleet", "agent", run.run_id, pointer, critical=True)
        assert service.get_run("fleet", "run-1").status is RunStatus.SYSTEM_ERROR


def test_failed_row_insert_removes_the_blob(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    service = _service(tmp_path, store)
    service.start_run("fleet", "agent", "run-1")

    def chunks_then_stop() -> Iterator[bytes | UploadEnd]:
        yield b"payload"
        # The run stops while the bytes stream in: the row is refused, so the blob must go.
        service.stop_run("fleet", "agent", "run-1", RunStatus.CANCELLED, "cancelled mid-upload")
        yield UploadEnd(7)

    with pytest.raises(FailedPrecondition) as refused:
        service.upload("fleet", ArtifactUpload("run-1", "s", "x"), chunks_then_stop())
    assert refused.value.reason == "RUN_STOPPED"
    assert list(store.list()) == []


@pytest.mark.parametrize(("parts", "reason"), [
    ([b"abc"], "UPLOAD_TRUNCATED"),
    ([b"abc", UploadEnd(4)], "UPLOAD_TRUNCATED"),
    ([b"abc", UploadEnd(3, "0" * 64)], "UPLOAD_HASH_MISMATCH"),
    ([b"abc", UploadEnd(3), b"d"], "UPLOAD_MALFORMED"),
])
def test_upload_without_a_matching_trailer_stores_nothing(
        tmp_path: Path, parts: list[bytes | UploadEnd], reason: str) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    service = _service(tmp_path, store)
    service.start_run("fleet", "agent", "run-1")
    with pytest.raises(InvalidArgument) as caught:
        service.upload("fleet", ArtifactUpload("run-1", "s", "x"), parts)
    assert caught.value.reason == reason
    assert list(store.list()) == []
    assert not any((tmp_path / "blobs" / ".tmp").iterdir())
    assert service.list_artifacts("fleet", "run-1", "", "", 10) == ([], "")


def test_upload_with_a_matching_trailer_hash_is_stored(tmp_path: Path) -> None:
    service = _service(tmp_path, FileBlobStore(tmp_path / "blobs"))
    service.start_run("fleet", "agent", "run-1")
    digest = hashlib.sha256(b"abc").hexdigest()
    art = service.upload("fleet", ArtifactUpload("run-1", "s", "x"),
                        [b"a", b"bc", UploadEnd(3, digest)])
    assert (art.size_bytes, art.hash) == (3, digest)
