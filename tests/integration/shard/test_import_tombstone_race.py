"""ImportRecords and ImportTombstones of the same record id, racing (SQLite and Postgres): at
most one of them stores, never a record beside its own tombstone.

The record import is held between its checks and its write until the tombstone import has
finished or 2 s have passed. Without the per-fleet import lock the tombstone import finished
in that window on Postgres and both committed (checked)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from services.common.commitment import new_salt
from services.common.db import Database
from services.common.erasure_source import ErasureOrder
from services.common.errors import EngramError
from services.common.tokens import Principal
from services.shard.domain import records
from services.shard.domain.records import Record, Tombstone
from services.shard.server import MIGRATIONS
from services.shard.service import ShardService
from services.shard.tombstones import TombstoneImports

ADMIN = Principal(agent_id="op", fleet_id="fleet-a", roles=frozenset({"admin"}))


class OneErasure:
    def __init__(self, record: Record) -> None:
        self.order = ErasureOrder("era_" + "1" * 28, "fleet-a", "op",
                                  (("record", record.id, record.record_hash),))

    def erasure(self, erasure_id: str) -> ErasureOrder:
        return self.order


@pytest.fixture(params=["sqlite", "postgres"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = (f"sqlite:///{tmp_path / 'shard.db'}" if request.param == "sqlite"
           else str(request.getfixturevalue("fresh_postgres_url")))
    database = Database(url)
    database.upgrade(MIGRATIONS)
    yield ShardService(database)
    database.engine.dispose()


def test_a_record_and_its_tombstone_are_never_both_stored(service: ShardService) -> None:
    content = "the door code is 4-8-15"
    record = records.seal(Record(
        id=records.new_record_id(), fleet_id="fleet-a", run_id="run-1", agent_id="scout-1",
        content=content, content_hash=records.content_hash(content), record_hash="",
        domain="insights", source="manual", importance=0.5, tags=(), metadata={},
        cross_refs=(), created_us=1_700_000_000_000_000, format=2, salt=new_salt()))
    tombstone = Tombstone(
        id=record.id, fleet_id="fleet-a", run_id="run-1", agent_id="scout-1", format=2,
        body_commitment=record.body_commitment, record_hash=record.record_hash,
        domain="insights", source="manual", importance=0.5, cross_refs=(),
        created_us=record.created_us, gate_decision_id="", erasure_id="era_" + "1" * 28,
        erased_us=record.created_us + 1, erased_by="op")
    tombstones = TombstoneImports(service, OneErasure(record))

    checked, tombstone_done = threading.Event(), threading.Event()
    erased_among = service.repo.erased_among

    def checks_then_waits(session: Any, ids: Any) -> dict[str, str]:
        found = erased_among(session, ids)
        checked.set()
        tombstone_done.wait(2.0)  # the race's window, held open
        return found

    service.repo.erased_among = checks_then_waits  # type: ignore[method-assign]
    outcomes: dict[str, str] = {}

    def import_record() -> None:
        try:
            outcomes["record"] = str(service.import_records(ADMIN, [record]))
        except EngramError as error:
            outcomes["record"] = error.reason

    def import_tombstone() -> None:
        checked.wait(5.0)
        try:
            outcomes["tombstone"] = str(tombstones.import_tombstones(ADMIN, [tombstone]))
        except EngramError as error:
            outcomes["tombstone"] = error.reason
        finally:
            tombstone_done.set()

    threads = [threading.Thread(target=import_record), threading.Thread(target=import_tombstone)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    service.repo.erased_among = erased_among  # type: ignore[method-assign]
    with service.db.session() as session:
        live = service.repo.existing(session, [record.id])
        erased = service.repo.erased_among(session, [record.id])
    assert not (live and erased), outcomes
    assert outcomes == {"record": "(1, 0)", "tombstone": "RECORD_NOT_ERASED"}, outcomes
