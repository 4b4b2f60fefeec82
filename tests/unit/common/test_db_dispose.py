"""A store's dispose closes the connections still checked out, too.

SQLAlchemy's ``Engine.dispose`` closes the pooled connections and abandons the pool; one
checked out at that moment (a gRPC handler thread that ``server.stop(0)`` did not wait for, a
worker finishing) went back into the abandoned pool and stayed open until the garbage
collector deleted it, when psycopg raised a ResourceWarning inside whichever test ran then
(with warnings as errors: a failure in an unrelated test). Checked failing with the plain
``engine.dispose()``: both connections below were left open."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import text

from services.common.db import Database


@pytest.mark.parametrize("held_seconds", [0.2, 0.6])
def test_a_connection_checked_out_at_dispose_is_closed(fresh_postgres_url: str,
                                                       held_seconds: float) -> None:
    """0.2 s: back within the wait, closed by the dispose; 0.6 s: after it (the wait here is
    0.3 s), closed as it comes back."""
    database = Database(fresh_postgres_url)
    held = threading.Event()
    raw: list[Any] = []

    def worker() -> None:
        with database.session() as session:
            session.execute(text("SELECT 1"))
            raw.append(session.connection().connection.dbapi_connection)
            held.set()
            time.sleep(held_seconds)

    thread = threading.Thread(target=worker)
    thread.start()
    assert held.wait(10)
    database.dispose(wait_seconds=0.3)
    thread.join(10)
    assert raw and raw[0].closed, "a connection checked out at dispose was left open"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_disposed_store_is_used_again_with_its_connections_kept(
        backend: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    """After a dispose the store opens a new pool; its connections are kept between sessions,
    not closed at every check-in (the first version's listener carried over to the new pool:
    every second SQLite session failed with AttributeError, every Postgres session opened a
    new backend)."""
    url = (f"sqlite:///{tmp_path / 'store.db'}" if backend == "sqlite"
           else str(request.getfixturevalue("fresh_postgres_url")))
    database = Database(url)
    with database.session() as session:
        session.execute(text("SELECT 1"))
    database.dispose()
    seen = []
    for _ in range(4):
        with database.session() as session:
            session.execute(text("SELECT 1"))
            seen.append(id(session.connection().connection.dbapi_connection))
    assert len(set(seen)) == 1, "each session after the dispose opened a new connection"
    database.dispose()
