"""``file://DIR``: blobs as files under one directory.

A put streams into a temporary file under ``DIR/.tmp``, fsyncs it, links it to
its final name (``link`` fails when the name exists: an atomic put-if-absent,
which ``rename`` is not), then fsyncs the directory so the entry survives a
crash, and the parent of every directory above it, up to ``DIR``, that this store
has not itself seen synced (a new ``a/b/`` is only durable once ``a`` and ``DIR``
are synced too). Not only the directories the put created: a put that failed or
was killed after its ``mkdir`` left directories nobody synced into their parents,
and the next put finds them existing (found by review). Keys are validated and the
resolved path must stay under ``DIR``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urlparse

from services.common.blobstore.port import BlobInfo, BlobStore, validate_key, write_hashed
from services.common.errors import AlreadyExists, InvalidArgument, NotFound

_TMP_DIR = ".tmp"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_parents(path: Path, root: Path) -> None:
    """Create the missing directories above ``path`` (below ``root``)."""
    missing: list[Path] = []
    parent = path.parent
    while parent != root and not parent.is_dir():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)


def _version(stat: os.stat_result) -> str:
    return f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}"


_LINKED_MAX = 100_000
"""How many synced directories a store remembers; past it, it forgets them all (a long-lived
compactor puts under a few new directories per run), and syncs each again once."""

STALE_PART_SECONDS = 3600.0
"""A ``.part`` file not written to for this long belongs to a put that died (a process killed
mid-upload); a store opening the directory removes it."""


class FileBlobStore(BlobStore):
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        # Directories below the root whose entry, and every ancestor's up to the root, this
        # store has synced. Filled only after the fsyncs succeeded, and empty in a new process:
        # a directory a failed or killed put made is synced again.
        self._linked: set[Path] = set()
        self._linked_lock = threading.Lock()
        (self.root / _TMP_DIR).mkdir(exist_ok=True)
        self._sweep_parts()

    def _sweep_parts(self) -> None:
        """Remove what puts killed mid-way left in ``.tmp`` (found by review on 2026-11-30: a
        SIGKILL during an upload of up to 5 GiB left its part for good). Only parts idle for
        :data:`STALE_PART_SECONDS`: another process sharing the directory may be writing one."""
        cutoff = time.time() - STALE_PART_SECONDS
        for part in (self.root / _TMP_DIR).glob("*.part"):
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
                if part.stat().st_mtime < cutoff:
                    part.unlink()

    @classmethod
    def from_url(cls, url: str) -> FileBlobStore:
        parsed = urlparse(url)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise InvalidArgument(f"not a local file URL: {url!r} (use file:///absolute/dir)")
        if not parsed.path:
            raise InvalidArgument(f"file URL {url!r} names no directory")
        return cls(Path(unquote(parsed.path)))

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        validate_key(key)
        if key.split("/", 1)[0] == _TMP_DIR:
            raise InvalidArgument(f"blob key {key!r} uses the reserved {_TMP_DIR!r} directory",
                                  reason="INVALID_BLOB_KEY")
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise InvalidArgument(f"blob key {key!r} resolves outside the store",
                                  reason="INVALID_BLOB_KEY")
        return path

    def put(self, key: str, chunks: Iterable[bytes],
            before_commit: Callable[[BlobInfo], None] | None = None) -> BlobInfo:
        final = self._path(key)
        if final.exists():
            raise AlreadyExists(f"blob {key!r} already exists", reason="BLOB_EXISTS")
        tmp = self.root / _TMP_DIR / f"{uuid.uuid4().hex}.part"
        try:
            with open(tmp, "xb") as handle:
                info = write_hashed(key, chunks, handle, before_commit)
                handle.flush()
                os.fsync(handle.fileno())
                info = replace(info, version=_version(os.fstat(handle.fileno())))
            _make_parents(final, self.root)
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise AlreadyExists(f"blob {key!r} already exists", reason="BLOB_EXISTS") from None
            try:
                self._sync_directories(final)
            except BaseException:
                # Not durable, so not published: the caller stores no pointer to it.
                with contextlib.suppress(OSError):
                    final.unlink()
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return info

    def version(self, key: str) -> str | None:
        """The file's inode, size and modification time: another put at this key (after a
        delete) is another file (the link keeps the temp file's)."""
        try:
            return _version(self._path(key).stat())
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"blob {key!r} not found in {self.url}",
                           reason="BLOB_NOT_FOUND") from None

    def make_durable(self, key: str) -> None:
        """Fsync the blob's file and its directories up to the root: a put killed between its
        link and its fsyncs left it visible but maybe not durable."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"blob {key!r} not found in {self.url}",
                           reason="BLOB_NOT_FOUND") from None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sync_directories(path)

    def _sync_directories(self, path: Path) -> None:
        """Make ``path``'s entry durable: fsync its directory, then the parent of each directory
        above it, up to the root, whose entry this store has not synced yet."""
        _fsync_dir(path.parent)
        unsynced: list[Path] = []
        directory = path.parent
        with self._linked_lock:
            while directory != self.root and directory not in self._linked:
                unsynced.append(directory)
                directory = directory.parent
        for directory in unsynced:
            _fsync_dir(directory.parent)
        with self._linked_lock:
            if len(self._linked) + len(unsynced) > _LINKED_MAX:
                self._linked.clear()
            self._linked.update(unsynced)

    def open(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        path = self._path(key)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed by the generator below
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"blob {key!r} not found in {self.url}",
                           reason="BLOB_NOT_FOUND") from None
        return self._read(handle, chunk_size)

    @staticmethod
    def _read(handle: IO[bytes], chunk_size: int) -> Iterator[bytes]:
        with handle:
            while chunk := handle.read(chunk_size):
                yield chunk

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            _fsync_dir(path.parent)

    def list(self, prefix: str = "") -> Iterator[str]:
        # Walk only the directory the prefix names (a run's files, not every fleet's).
        base = prefix.rpartition("/")[0]
        start = self._path(base) if base else self.root
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            if Path(dirpath) == self.root:
                dirnames[:] = [d for d in dirnames if d != _TMP_DIR]
            rel = Path(dirpath).relative_to(self.root)
            for name in filenames:
                key = (rel / name).as_posix() if rel != Path(".") else name
                if key.startswith(prefix):
                    keys.append(key)
        return iter(sorted(keys))
