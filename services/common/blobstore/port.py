"""The blob-store port every adapter implements."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from services.common.errors import InvalidArgument, NotFound

MAX_KEY_LENGTH = 1024


@dataclass(frozen=True)
class BlobInfo:
    key: str
    size_bytes: int
    sha256: str
    version: str | None = None
    """What :meth:`BlobStore.version` answers for the blob this put stored (None: unknown)."""


def validate_key(key: str) -> str:
    """A relative ``/``-separated key with no empty, ``.`` or ``..`` segment (checked on every
    access; a new key also by :func:`validate_new_key`)."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidArgument(
            f"blob key must be 1..{MAX_KEY_LENGTH} characters, got {len(key)}",
            reason="INVALID_BLOB_KEY",
        )
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidArgument(
            f"blob key {key!r} must be relative, '/'-separated, without NUL or backslash",
            reason="INVALID_BLOB_KEY",
        )
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgument(
            f"blob key {key!r} has an empty, '.' or '..' segment (path traversal is refused)",
            reason="INVALID_BLOB_KEY",
        )
    return key


def validate_new_key(key: str) -> str:
    """A key a new blob may take: :func:`validate_key`'s, and no control character (C0, DEL,
    C1). S3 lists keys in XML, which cannot carry most of them: a listing that could not be
    read, or gave "\r" back as "\n", kept an erased run's blobs (found by review on
    2026-11-30), and a file name with one is a trap for an operator's shell. Keys stored
    before stay readable, verifiable and erasable (the check is not made on access)."""
    validate_key(key)
    control = next((c for c in key if c < " " or "\x7f" <= c <= "\x9f"), None)
    if control is not None:
        raise InvalidArgument(
            f"blob key {key!r} holds a control character (U+{ord(control):04X})",
            reason="INVALID_BLOB_KEY",
        )
    return key


class BlobStore(ABC):
    @abstractmethod
    def put(self, key: str, chunks: Iterable[bytes],
            before_commit: Callable[[BlobInfo], None] | None = None) -> BlobInfo:
        """Write atomically from a stream of chunks; nothing is visible unless all arrived.

        Refuses to replace an existing key (put-if-absent). ``before_commit`` sees
        the size and hash once every byte is in and may raise to abandon the put.
        """

    @abstractmethod
    def open(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Stream a blob's bytes; raises ``NotFound`` when absent."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    def version(self, key: str) -> str | None:
        """What tells the blob at ``key`` from other bytes put there later (after a delete):
        equal answers mean the same bytes. None: this store cannot tell (a caller then reads
        the bytes). NotFound when there is none."""
        if not self.exists(key):
            raise NotFound(f"blob {key!r} not found", reason="BLOB_NOT_FOUND")
        return None

    def make_durable(self, key: str) -> None:  # noqa: B027 - most stores need nothing
        """Make an existing blob survive a crash, for a caller reusing one it found rather than
        put (a put killed after it became visible may not have made it durable). The default
        does nothing: an object store's blob is durable once visible."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove a blob; absent keys are not an error."""

    def purge(self, key: str) -> None:
        """Remove a blob and every earlier version of it (erasure); absent is not an error.
        A store without versions deletes it."""
        self.delete(key)

    def purge_prefix(self, prefix: str) -> int:
        """Every blob under ``prefix`` with every earlier version (erasing a whole run), also
        of keys whose current version is gone; returns how many keys were current."""
        keys = list(self.list(prefix))
        for key in keys:
            self.purge(key)
        return len(keys)

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix``, in lexicographic order."""

    @property
    def url(self) -> str:
        """Where the blobs live (``file:///…``, ``s3://bucket/prefix``), for logs and status."""
        return type(self).__name__

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing
        """Release clients or handles; the default holds none."""


def write_hashed(key: str, chunks: Iterable[bytes], sink: IO[bytes],
                 before_commit: Callable[[BlobInfo], None] | None) -> BlobInfo:
    """Copy ``chunks`` into ``sink`` while hashing; ``before_commit`` sees the totals and may
    refuse (by raising) before the adapter makes anything visible."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        sink.write(chunk)
        digest.update(chunk)
        size += len(chunk)
    info = BlobInfo(key=key, size_bytes=size, sha256=digest.hexdigest())
    if before_commit is not None:
        before_commit(info)
    return info
