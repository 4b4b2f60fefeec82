"""Search's read of its candidates (ShardRepository.live_by_ids: SQL text on the driver's
cursor) gives what by_ids(exclude_compacted=True) gives, on SQLite and Postgres: the fleet's
records only, no original a compaction summary covers, ids repeated or unknown, more ids than
one statement carries, and DATA_LOSS for a row whose JSON no longer parses."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, text

from engram.client import ShardClient
from services.common.db import Database
from services.common.errors import IntegrityError, Unavailable
from services.shard import repository
from services.shard.domain import records
from services.shard.domain.records import Record
from services.shard.repository import ShardRepository
from services.shard.server import MIGRATIONS
from services.shard.service import ShardService


def _record(fleet: str, serial: int) -> Record:
    return Record(id=records.new_record_id(), fleet_id=fleet, run_id=f"run-{serial % 3}",
                  agent_id="scout", content=f"note {serial}", content_hash="h" * 64,
                  record_hash="r" * 64, domain="general", source="tool", importance=0.25,
                  tags=("a", "b") if serial % 2 else (),
                  metadata={"k": f"v{serial}"} if serial % 3 else {},
                  cross_refs=("domain:general",) if serial % 5 == 0 else (),
                  created_us=1_700_000_000_000_000 + serial, format=2, salt="s" * 64,
                  body_commitment="b" * 64, gate_decision_id=f"dec-{serial}")


def test_live_by_ids_reads_what_by_ids_reads(shard_db_url: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repository, "_LIVE_CHUNK", 7)  # several statements for 25 ids
    db = Database(shard_db_url)
    try:
        db.prepare_schema(MIGRATIONS, "shard", migrate=True)
        repo = ShardRepository(db.dialect)
        mine = [_record("fleet-a", i) for i in range(20)]
        theirs = [_record("fleet-b", i) for i in range(3)]
        with db.session() as session:
            repo.insert(session, mine + theirs)
            session.execute(text(
                "INSERT INTO compactions (original_id, summary_id, fleet_id, original_hash, "
                "created_us) VALUES (:o, :s, 'fleet-a', :h, 1)"),
                [{"o": mine[i].id, "s": mine[0].id, "h": "r" * 64} for i in (3, 4)])
        ids = ([r.id for r in mine] + [r.id for r in theirs] + [mine[1].id, "0" * 32]
               + [mine[2].id])
        with db.session() as session:
            expected = repo.by_ids(session, "fleet-a", ids, exclude_compacted=True)
            assert repo.live_by_ids(session, "fleet-a", ids) == expected
        with db.reading() as connection:  # search's Core connection
            found = repo.live_by_ids(connection, "fleet-a", ids)
            assert repo.live_by_ids(connection, "fleet-a", []) == {}
        assert found == expected
        assert set(found) == {r.id for r in mine} - {mine[3].id, mine[4].id}
        assert found[mine[1].id] == mine[1]  # every field as written
        assert found[mine[5].id] == mine[5]

        with db.session() as session:  # a stored JSON field broken behind the service's back
            session.execute(text("UPDATE records SET tags_json = '[broken' WHERE id = :i"),
                            {"i": mine[7].id})
        with db.reading() as connection, pytest.raises(IntegrityError) as broken:
            repo.live_by_ids(connection, "fleet-a", [mine[7].id])
        assert broken.value.reason == "RECORD_FIELD_UNREADABLE"
    finally:
        db.dispose()


def test_a_connection_lost_under_the_read_is_unavailable(fresh_postgres_url: str) -> None:
    """A database that drops the connection under the read is UNAVAILABLE, as for any other
    read. (Its SQL goes through SQLAlchemy's error handling, exec_driver_sql, which also marks
    the link invalid; on the driver's bare cursor, tried first, this case was UNAVAILABLE too,
    by way of the failed rollback as the connection went back to the pool.)"""
    db = Database(fresh_postgres_url)
    try:
        db.prepare_schema(MIGRATIONS, "shard", migrate=True)
        repo = ShardRepository(db.dialect)
        with pytest.raises(Unavailable), db.reading() as connection:
            pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            with db.engine.connect() as other:
                other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            repo.live_by_ids(connection, "fleet-a", ["0" * 32])
    finally:
        db.dispose()


@pytest.mark.parametrize("cross", [False, True])
def test_a_search_holds_one_database_connection_at_a_time(
        shard: tuple[str, ShardService], client: ShardClient, cross: bool) -> None:
    """A search read its candidates on a connection opened before the index's catch-up, which
    takes one of its own: two per search, so once searches held the pool, the catch-up waited
    for the pool's timeout and every search stalled, then failed DATABASE_BUSY (found in
    review, 2026-11-30: two searches on a pool of 1 + 1, 1.01 s each, one refused)."""
    _, service = shard
    for serial in range(30):
        client.add(f"alpha beta note {serial}", run_id="run-1")
    held: dict[int, int] = {}
    peak: dict[int, int] = {}
    lock = threading.Lock()

    def checkout(*_: object) -> None:
        me = threading.get_ident()
        with lock:
            held[me] = held.get(me, 0) + 1
            peak[me] = max(peak.get(me, 0), held[me])

    def checkin(*_: object) -> None:
        me = threading.get_ident()
        with lock:
            held[me] = held.get(me, 0) - 1

    event.listen(service.db.engine, "checkout", checkout)
    event.listen(service.db.engine, "checkin", checkin)
    try:
        for serial in range(5):  # each search catches up on a write made just before it
            client.add(f"alpha gamma later {serial}", run_id="run-2")
            assert client.search("alpha", mode="lexical", cross=cross)
    finally:
        event.remove(service.db.engine, "checkout", checkout)
        event.remove(service.db.engine, "checkin", checkin)
    assert peak and max(peak.values()) == 1, peak
