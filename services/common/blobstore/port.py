"""The blob-store port every adapter implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class BlobInfo:
    key: str
    size_bytes: int
    sha256: str


class BlobStore(ABC):
    @abstractmethod
    def put(self, key: str, chunks: Iterable[bytes]) -> BlobInfo:
        """Write atomically from a stream of chunks; nothing is visible unless all arrived.

        Refuses to replace an existing key (put-if-absent).
        """

    @abstractmethod
    def open(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Stream a blob's bytes; raises ``NotFound`` when absent."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove a blob; absent keys are not an error."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix``, in lexicographic order."""
