"""``Database.reading``: the Core connection behind a search's catch-up read.

It must see what was committed before it, hold no transaction once it is back in the pool
(SQLite: a writer after it is not kept waiting), and turn an unreachable database into
UNAVAILABLE ``DATABASE_UNAVAILABLE``, as a session does."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sqlalchemy import text

from services.common.db import Database
from services.common.errors import Unavailable


def test_a_read_sees_committed_rows_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'store.db'}", pool_size=1)
    with database.session() as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
        session.execute(text("INSERT INTO t VALUES (1)"))
    with database.reading() as connection:
        assert connection.execute(text("SELECT x FROM t")).scalars().all() == [1]
    # The one pooled connection again: a BEGIN IMMEDIATE fails if a transaction is still open.
    with database.writing() as session:
        session.execute(text("INSERT INTO t VALUES (2)"))
    with database.reading() as connection:
        assert connection.execute(text("SELECT count(*) FROM t")).scalar() == 2
    database.dispose()


def test_an_unreachable_database_is_unavailable_not_a_driver_error() -> None:
    with socket.socket() as bound:  # bound, never listening: a connection is refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        database = Database(f"postgresql+psycopg://postgres@127.0.0.1:{port}/engram")
        with pytest.raises(Unavailable) as raised, database.reading() as connection:
            connection.execute(text("SELECT 1"))
        assert raised.value.reason == "DATABASE_UNAVAILABLE"
        database.dispose()
