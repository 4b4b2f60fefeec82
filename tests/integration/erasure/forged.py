"""What someone with write access to a service's SQLite file does behind its back: deletes a
run's rows and leaves a tombstone of their own making in their place."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from pathlib import Path


def replace_with_tombstone(db_path: Path, run_id: str, deleted_from: Iterable[str],
                           tombstones: str, row: Mapping[str, object]) -> None:
    """Delete ``run_id``'s rows from each of ``deleted_from``, then insert ``row`` into the
    ``tombstones`` table, without the service."""
    with closing(sqlite3.connect(db_path)) as db:
        for table in deleted_from:
            db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
        db.execute(f"INSERT INTO {tombstones} ({', '.join(row)}) "
                   f"VALUES ({', '.join('?' for _ in row)})", tuple(row.values()))
        db.commit()
