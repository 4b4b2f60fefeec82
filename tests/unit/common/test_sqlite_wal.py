"""SQLite's WAL stays small, so a small volume that fills can get its space back."""

from __future__ import annotations

import errno
import sqlite3
import threading
from pathlib import Path

from sqlalchemy import text

from services.common.db import WAL_SIZE_LIMIT_BYTES, Database
from services.common.errors import ResourceExhausted, Unavailable
from services.common.storage_errors import storage_error


def test_the_wal_is_checkpointed_and_truncated_near_one_megabyte(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'wal.db'}")
    with database.session() as session:
        session.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)"))
    wal = tmp_path / "wal.db-wal"
    largest = 0
    for _ in range(600):  # 600 commits of 8 KB: ~5 MB through the WAL
        with database.session() as session:
            session.execute(text("INSERT INTO t (body) VALUES (:b)"), {"b": bytes(8192)})
        largest = max(largest, wal.stat().st_size)
    # SQLite's defaults let it reach and keep ~4 MB; a checkpoint every 256 pages and the
    # size limit keep it near 1 MB (one commit's pages may overshoot the limit).
    assert largest < WAL_SIZE_LIMIT_BYTES + (256 << 10), largest
    assert database.checkpoint()
    assert wal.stat().st_size == 0
    database.dispose()


def test_storage_failures_are_named_wherever_they_are_in_the_chain() -> None:
    full = OSError(errno.ENOSPC, "No space left on device", "/data/blobs/x.tmp")
    try:
        try:
            raise full
        except OSError as inner:
            raise RuntimeError("upload failed") from inner
    except RuntimeError as outer:
        found = storage_error(outer)
    assert isinstance(found, ResourceExhausted) and found.reason == "STORAGE_FULL"
    sqlite_full = sqlite3.OperationalError("database or disk is full")
    assert storage_error(sqlite_full).reason == "STORAGE_FULL"  # type: ignore[union-attr]
    io_error = storage_error(OSError(errno.EIO, "Input/output error"))
    assert isinstance(io_error, Unavailable) and io_error.reason == "STORAGE_IO_ERROR"

    class DiskFull(Exception):  # psycopg's errors carry the SQLSTATE
        sqlstate = "53100"

    disk_full = storage_error(DiskFull("could not extend file"))
    assert disk_full is not None and disk_full.reason == "STORAGE_FULL"
    assert storage_error(ValueError("a bug")) is None
    assert storage_error(OSError(errno.ENOENT, "missing")) is None


def test_erasure_purges_at_once_and_auto_checkpoints_do_not_report_the_wal_busy(
        tmp_path: Path) -> None:
    # Found by CI: two calls carrying out one erasure at once both purged; SQLite answers a
    # TRUNCATE checkpoint busy at once (no busy timeout) while another connection checkpoints,
    # so one call failed UNAVAILABLE WAL_BUSY after its commit and its retry said "already
    # erased". Only a reader holding the WAL may make a purge fail.
    database = Database(f"sqlite:///{tmp_path / 'purge.db'}")
    with database.session() as session:
        session.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)"))
    busy: list[str] = []

    def erase_and_purge() -> None:
        for _ in range(12):
            with database.writing() as session:  # commits past the auto-checkpoint size
                session.execute(text("INSERT INTO t (body) VALUES (randomblob(1500000))"))
            try:
                database.vacuum([])
            except Unavailable as error:
                busy.append(error.reason)

    workers = [threading.Thread(target=erase_and_purge) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert busy == []
    assert (tmp_path / "purge.db-wal").stat().st_size == 0
    database.dispose()


def test_every_connection_is_wal_with_full_sync(tmp_path: Path) -> None:
    # README: "SQLite gets WAL and synchronous=FULL": an acknowledged write survives a power
    # loss only with FULL (2); NORMAL (1) may lose the last commits in WAL mode.
    database = Database(f"sqlite:///{tmp_path / 'sync.db'}")
    with database.session() as session:
        assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert session.execute(text("PRAGMA synchronous")).scalar() == 2
        assert session.execute(text("PRAGMA secure_delete")).scalar() == 1
        # Each connection's own page cache, 512 KiB (SQLite's default is 2 MB a connection).
        assert session.execute(text("PRAGMA cache_size")).scalar() == -512
    database.dispose()
