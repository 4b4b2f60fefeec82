"""SearchIndex.forget after an erasure: the fleet's index is rebuilt without the erased
records (and the terms they lent their run neighbours), other fleets are untouched, a second
call costs nothing, and the saved snapshot still matches the store, so the next start loads
it instead of rebuilding."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import delete

from services.common.db import Database
from services.shard.search.index import SearchIndex
from services.shard.tables import RECORDS
from tests.unit.retrieval.test_index_snapshot import OTHER, _store, _write

TEXTS = ["the vault combination is four eight fifteen", "the next step of the same run",
         "an unrelated note about gardens"]


def _erase(database: Database, record_id: str) -> None:
    with database.session() as session:  # what the eraser does to the records table
        session.execute(delete(RECORDS).where(RECORDS.c.id == record_id))


def test_forget_rebuilds_the_fleet_and_the_snapshot_stays_loadable(tmp_path: Path) -> None:
    database = _store(tmp_path / "shard.db")
    _write(database, TEXTS)
    _write(database, ["the vault in another fleet"], OTHER)
    path = tmp_path / "index.snapshot"
    index = SearchIndex(database, None, snapshot_path=path)
    index.warm_up()
    secret = index.search("f", "vault combination", "lexical")[0][0]
    assert len(index.search("f", "vault combination", "lexical")) >= 2  # neighbours share it

    _erase(database, secret)
    assert index.forget("f", [secret])
    assert index.search("f", "vault combination", "lexical") == []
    assert index.search("g", "vault", "lexical")  # the other fleet untouched
    assert not index.forget("f", [secret])  # idempotent: nothing left to drop
    assert b"combination" not in path.read_bytes()

    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert restarted.search("f", "vault combination", "lexical") == []
    assert ([restarted.search("f", q, "lexical") for q in ("next step", "gardens")]
            == [index.search("f", q, "lexical") for q in ("next step", "gardens")])


def test_the_fleet_is_searched_while_it_is_rebuilt_and_keeps_what_arrived(
        tmp_path: Path) -> None:
    database = _store(tmp_path / "shard.db")
    _write(database, TEXTS)
    index = SearchIndex(database, None, snapshot_path=tmp_path / "index.snapshot")
    index.warm_up()
    secret = index.search("f", "vault combination", "lexical")[0][0]
    _erase(database, secret)
    build = index._rebuilt
    seen_meanwhile: list[list[tuple[str, float]]] = []

    def rebuilt_while_written_and_searched(*args: object) -> object:
        fresh = build(*args)  # type: ignore[arg-type]
        _write(database, ["a late note about the orchard"])  # handed to the old index
        seen_meanwhile.append(index.search("f", "orchard", "lexical"))  # not held up
        return fresh

    index._rebuilt = rebuilt_while_written_and_searched  # type: ignore[method-assign]
    assert index.forget("f", [secret])
    late = seen_meanwhile[0][0][0]  # the note itself ranks first (its run neighbours after)
    assert index.search("f", "orchard", "lexical")[0][0] == late
    assert index.search("f", "vault combination", "lexical") == []
