"""Lookups by id stay lookups by id on SQLite.

Given ``fleet_id = ? AND id IN (...)``, SQLite's planner walks the fleet's index (every row of
the fleet, per call) instead of looking each id up: an import of 100k gate decisions spent 41
of its 100 s there, growing with the table. Each repository call here runs against a migrated
empty store; every statement it sends is explained, and one that searches by a fleet index
fails the test. (Checked failing with the fleet back in the decisions lookup.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from services.common.db import Database
from services.governance.repository import GovernanceRepository
from services.governance.server import MIGRATIONS as GOVERNANCE_MIGRATIONS
from services.shard.domain.records import Record
from services.shard.erasure import RecordEraser
from services.shard.repository import ShardRepository
from services.shard.server import MIGRATIONS as SHARD_MIGRATIONS

IDS = [f"{i:032x}" for i in range(200)]


@contextmanager
def plans(db: Database) -> Iterator[list[str]]:
    """The query plan of every statement sent to ``db`` inside the block."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        if not executemany and statement.lstrip().upper().startswith(("SELECT", "DELETE")):
            sent.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", record)
    found: list[str] = []
    try:
        yield found
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    with db.engine.connect() as conn:
        for statement, parameters in sent:
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
            found.extend(str(row[-1]) for row in rows)


def store(tmp_path: Path, migrations: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'store.db'}")
    db.upgrade(migrations)
    return db


CALLS: dict[str, tuple[Path, Callable[[Any], None]]] = {
    "governance decisions_by_id": (GOVERNANCE_MIGRATIONS, lambda s: GovernanceRepository(
        "sqlite").decisions_by_id(s, "fleet-a", IDS)),
    "shard by_ids": (SHARD_MIGRATIONS, lambda s: ShardRepository("sqlite").by_ids(
        s, "fleet-a", IDS)),
    "shard by_ids excluding compacted": (SHARD_MIGRATIONS, lambda s: ShardRepository(
        "sqlite").by_ids(s, "fleet-a", IDS, exclude_compacted=True)),
    "shard live_by_ids (search's read)": (SHARD_MIGRATIONS, lambda s: ShardRepository(
        "sqlite").live_by_ids(s, "fleet-a", IDS)),
    "shard links_from": (SHARD_MIGRATIONS, lambda s: ShardRepository("sqlite").links_from(
        s, "fleet-a", IDS)),
    "shard remove": (SHARD_MIGRATIONS, lambda s: ShardRepository("sqlite").remove(
        s, "fleet-a", IDS)),
    "shard erasure's derived rows": (SHARD_MIGRATIONS, lambda s: RecordEraser._drop_derived(
        s, "fleet-a", [_record(record_id) for record_id in IDS])),
}


def _record(record_id: str) -> Record:
    return Record(id=record_id, fleet_id="fleet-a", run_id="r", agent_id="a", content="c",
                  content_hash="h", record_hash="rh", domain="", source="", importance=0.5,
                  tags=(), metadata={}, cross_refs=(), created_us=1)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_lookup_by_ids_does_not_walk_the_fleet(tmp_path: Path, name: str) -> None:
    migrations, call = CALLS[name]
    db = store(tmp_path, migrations)
    try:
        with plans(db) as found, db.session() as session:
            session.execute(text("SELECT 1"))
            call(session)
        assert found, "nothing was sent"
        walking = [p for p in found if "fleet" in p and "(fleet_id=?)" in p]
        assert not walking, walking
    finally:
        db.engine.dispose()


def test_a_filtered_listing_searches_a_window_or_a_rare_tags_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ListRecords' page (ShardRepository.page): the tag conditions are probes by record id, no
    list of the fleet's records carrying a tag; the records are read within a window of seqs
    (``seq>?``: the window's floor), or looked up by the ids of a tag few carry. Unbounded,
    a filter nothing matches read the whole fleet (tests/integration/shard/test_list_cost.py
    counts the work)."""
    from services.shard import repository
    from services.shard.repository import RecordFilter

    monkeypatch.setattr(repository, "PAGE_EXAMINE_BUDGET", 330)  # 10 rows of 33 checks
    tags = tuple(f"t{i:02d}" for i in range(31))
    db = store(tmp_path, SHARD_MIGRATIONS)
    repo = ShardRepository("sqlite")
    try:
        with db.session() as session:
            repo.insert(session, [
                dataclasses.replace(_record(record_id), metadata={"k": "v"},
                                    tags=tags + (("rare",) if i == 5 else ()))
                for i, record_id in enumerate(IDS[:40])])
        for flt in (RecordFilter("fleet-a", tags=tags, metadata=(("k", "absent"),)),
                    RecordFilter("fleet-a", tags=(*tags[:3], "rare"))):
            with plans(db) as found, db.session() as session:
                repo.page(session, flt, None, 5)
            assert not [p for p in found if "LIST SUBQUERY" in p], found
            reads = [p for p in found if p.startswith(("SEARCH records", "SCAN records"))]
            assert reads, found
            unbounded = [p for p in reads if not (
                "seq>?" in p or "(id=?)" in p or "(rowid=?)" in p or "COVERING INDEX" in p)]
            assert not unbounded, found
    finally:
        db.engine.dispose()
