"""The named blob steps of the tiers, and the hook tests make raise to crash exactly there."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from services.common.blobstore import BlobStore
from services.common.errors import IntegrityError, NotFound
from services.compactor.domain.blob_layout import digest_of

StepHook = Callable[[str], None]
STEPS = (
    "seal:before_rename", "seal:after_rename", "seal:after_index", "seal:after_commit",
    "snapshot:mid_gzip", "snapshot:before_rename", "snapshot:after_rename",
    "retention:mid",
)


def no_step_hook(_step: str) -> None:
    return None


def put_once(blobs: BlobStore, key: str, data: bytes | Iterable[bytes],
             expected_sha: str) -> None:
    """Atomic put-if-absent; an existing blob must be the same bytes (a redone step), and is
    made durable before it is used: the put that left it may have been killed before its
    fsyncs, and the seal that follows deletes the database's copy (found by review)."""
    if blobs.exists(key):
        if digest_of(b"".join(blobs.open(key))) != expected_sha:
            raise IntegrityError(f"blob {key} exists with different content",
                                 reason="BLOB_CONFLICT")
        blobs.make_durable(key)
        return
    chunks = [data] if isinstance(data, bytes) else data
    info = blobs.put(key, chunks)
    if info.sha256 != expected_sha:
        raise IntegrityError(f"blob {key} was stored with an unexpected digest")


def hooked(chunks: Iterable[bytes], hook: StepHook, mid: str | None,
           end: str) -> Iterator[bytes]:
    """``chunks`` with ``mid`` called before the second and ``end`` after the last."""
    for number, chunk in enumerate(chunks):
        if number == 1 and mid:
            hook(mid)
        yield chunk
    hook(end)  # the adapter has every byte in its temp file, nothing renamed yet


@dataclass(frozen=True)
class StoredBlob:
    """A blob as read at one moment: its bytes, or None when it was missing."""

    key: str
    data: bytes | None


def load(blobs: BlobStore, key: str) -> StoredBlob:
    try:
        return StoredBlob(key, b"".join(blobs.open(key)))
    except NotFound:
        return StoredBlob(key, None)
