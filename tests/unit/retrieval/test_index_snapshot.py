"""The lexical index saved to a file and loaded at start: the same answers as a rebuild, and a
damaged, stale or forged file costs a rebuild, never a wrong answer."""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

from services.common.db import Database
from services.common.errors import Unavailable
from services.common.tokens import Principal
from services.shard.domain.records import RecordDraft
from services.shard.retrieval.embedding import HashEmbedder
from services.shard.retrieval.lexical import GrowingBM25
from services.shard.search import index as index_module
from services.shard.search import snapshot as snapshot_module
from services.shard.search.fleet_index import ContextSettings, DocFacts, FleetIndex
from services.shard.search.index import SearchIndex
from services.shard.search.snapshot import (
    MAGIC,
    SnapshotRejected,
    header_for,
    read_snapshot,
    write_snapshot,
)
from services.shard.server import MIGRATIONS
from services.shard.service import ShardService

AGENT = Principal(agent_id="a", fleet_id="f", roles=frozenset({"agent"}))
OTHER = Principal(agent_id="b", fleet_id="g", roles=frozenset({"agent"}))
FIRST = ["the garden hose leaks at the tap", "quarterly revenue grew twelve percent",
         "the hose was replaced in spring", "revenue fell in the third quarter"]
LATER = ["a new hose arrived today", "the garden needs water"]
QUERIES = ["garden hose", "revenue quarter", "water", "spring"]


def _store(path: Path) -> Database:
    database = Database(f"sqlite:///{path}")
    database.upgrade(MIGRATIONS)
    return database


def _write(database: Database, texts: list[str], who: Principal = AGENT) -> None:
    ShardService(database).write(who, [RecordDraft(t, run_id="r1") for t in texts])


def _answers(index: SearchIndex) -> list[list[tuple[str, float]]]:
    return [index.search(fleet, q, "lexical") for fleet in ("f", "g") for q in QUERIES]


def _rebuilt(database: Database) -> list[list[tuple[str, float]]]:
    index = SearchIndex(database, None)
    index.warm_up()
    return _answers(index)


def _saved(database: Database, path: Path) -> SearchIndex:
    index = SearchIndex(database, None, snapshot_path=path)
    index.warm_up()
    assert index.save_snapshot() == len(FIRST) + 1
    return index


@pytest.fixture
def database(tmp_path: Path) -> Database:
    database = _store(tmp_path / "shard.db")
    _write(database, FIRST)
    _write(database, ["garden party in another fleet"], OTHER)
    return database


def test_a_restart_loads_the_snapshot_and_reads_only_what_came_after(
    database: Database, tmp_path: Path
) -> None:
    path = tmp_path / "index.snapshot"
    _saved(database, path)
    _write(database, LATER)
    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert restarted.records() == len(FIRST) + 1 + len(LATER)
    assert _answers(restarted) == _rebuilt(database)
    assert any(restarted.search("f", "new hose arrived", "lexical"))


def test_searches_are_refused_until_the_index_is_warm(database: Database) -> None:
    index = SearchIndex(database, None)
    with pytest.raises(Unavailable, match="loading"):
        index.search("f", "garden", "lexical")
    index.warm_up()
    assert index.search("f", "garden", "lexical")


def test_a_damaged_snapshot_is_rebuilt_from_the_records(
    database: Database, tmp_path: Path
) -> None:
    path = tmp_path / "index.snapshot"
    _saved(database, path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # one flipped bit in the payload
    path.write_bytes(bytes(data))
    _write(database, LATER)
    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert not restarted.loaded_from_snapshot
    assert _answers(restarted) == _rebuilt(database)


def test_a_snapshot_of_another_store_is_not_used(database: Database, tmp_path: Path) -> None:
    path = tmp_path / "index.snapshot"
    _saved(database, path)
    elsewhere = _store(tmp_path / "other.db")  # as many records, other texts (a restored backup)
    _write(elsewhere, [f"unrelated note {i}" for i in range(len(FIRST))])
    _write(elsewhere, ["garden"], OTHER)
    restarted = SearchIndex(elsewhere, None, snapshot_path=path)
    restarted.warm_up()
    assert not restarted.loaded_from_snapshot
    assert _answers(restarted) == _rebuilt(elsewhere)
    assert restarted.search("f", "garden hose", "lexical") == []


def test_a_payload_naming_other_code_is_refused_unrun(tmp_path: Path) -> None:
    path = tmp_path / "index.snapshot"
    marker = tmp_path / "ran"

    class Forged:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)

    frames = [("f", pickle.dumps(Forged()))]
    settings = repr(ContextSettings())
    write_snapshot(path, header_for(frames, position=0, gaps=[], records=0, last_id="",
                                    settings=settings), frames)
    assert path.read_bytes().startswith(MAGIC)
    with pytest.raises(SnapshotRejected, match="never holds"):
        read_snapshot(path, settings)
    assert not marker.exists()


def test_vectors_of_the_snapshot_records_are_loaded_back_not_lost(
    database: Database, tmp_path: Path
) -> None:
    path = tmp_path / "index.snapshot"
    first = SearchIndex(database, HashEmbedder(), snapshot_path=path)
    first.warm_up()
    while first.catch_up():
        pass
    assert first.indexed("f") == len(FIRST)
    first.save_snapshot()
    restarted = SearchIndex(database, HashEmbedder(), snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert restarted.lag() == len(FIRST) + 1  # lexical at once; vectors still to load
    while restarted.catch_up():
        pass
    assert restarted.lag() == 0
    assert restarted.indexed("f") == len(FIRST)
    assert restarted.search("f", FIRST[1], "semantic")[0] == first.search(
        "f", FIRST[1], "semantic")[0]


def test_a_rebuild_is_saved_before_the_index_says_ready(database: Database,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "index.snapshot"
    index = SearchIndex(database, None, snapshot_path=path, snapshot_every=1)
    index.warm_up()
    assert index.ready and path.exists()  # no save left to stall the first searches


def test_a_save_blocks_only_the_fleet_it_is_pickling(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes, catch-ups and searches of other fleets go on while a fleet is pickled, and
    records committed meanwhile are found at once (read-your-writes during a save)."""
    path = tmp_path / "index.snapshot"
    index = SearchIndex(database, None, snapshot_path=path)
    index.warm_up()
    pickling_g, release = threading.Event(), threading.Event()
    real_frame = snapshot_module.fleet_frame

    def slow_frame(fleet_id: str, fleet_index: object) -> tuple[str, bytes]:
        if fleet_id == "g":
            pickling_g.set()
            assert release.wait(30)
        return real_frame(fleet_id, fleet_index)

    monkeypatch.setattr(index_module, "fleet_frame", slow_frame)
    saver = threading.Thread(target=index.save_snapshot)
    saver.start()
    assert pickling_g.wait(30)
    try:
        found: list[list[tuple[str, float]]] = []
        searcher = threading.Thread(target=lambda: (
            _write(database, ["a brand new tulip bed"]),
            found.append(index.search("f", "tulip bed", "lexical"))))
        searcher.start()
        searcher.join(30)  # before the change the save held the lock every search takes
        assert not searcher.is_alive(), "a search of fleet f waited on the save of fleet g"
        assert found and found[0], "a record written during the save was not found"
    finally:
        release.set()
        saver.join(30)


def test_records_a_fleet_took_in_after_the_cursor_was_read_are_loaded_once(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fleet g is pickled after records written meanwhile reached it: the file holds them
    beyond its cursor; the load reads them again from the store and keeps one copy."""
    path = tmp_path / "index.snapshot"
    index = SearchIndex(database, None, snapshot_path=path)
    index.warm_up()
    real_frame = snapshot_module.fleet_frame

    def frame_after_writes(fleet_id: str, fleet_index: object) -> tuple[str, bytes]:
        if fleet_id == "f":  # f is pickled first (sorted), g after these reached it
            _write(database, ["garden gnomes on sale", "a gnome in the garden"], OTHER)
            index.sync()
        return real_frame(fleet_id, fleet_index)

    monkeypatch.setattr(index_module, "fleet_frame", frame_after_writes)
    assert index.save_snapshot() == len(FIRST) + 1  # what the cursor held when read
    _, saved = read_snapshot(path, repr(ContextSettings()))
    assert len(saved["g"].ids) == 3  # the two newer records rode along
    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert restarted.records() == len(FIRST) + 3  # each record once
    assert _answers(restarted) == _rebuilt(database)
    assert [doc for doc, _ in restarted.search("g", "gnome", "lexical")] == [
        doc for doc, _ in _rebuilt_index(database).search("g", "gnome", "lexical")]


def _rebuilt_index(database: Database) -> SearchIndex:
    index = SearchIndex(database, None)
    index.warm_up()
    return index


def test_one_fleets_new_records_are_analysed_outside_the_lock_every_fleet_syncs_under(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: the thread that synced analysed every fleet's new records under the
    sync lock, which every search and write of every fleet takes, so one fleet's batch of 120
    records of 32 KB (about 50 ms each) held another fleet's next search for 6 s. Here fleet
    f's new record takes as long as the test likes to analyse: fleet g is searched meanwhile
    (before, g's search waited for it)."""
    database = _store(tmp_path / "shard.db")
    _write(database, FIRST)
    _write(database, LATER, OTHER)
    index = SearchIndex(database, None)
    index.warm_up()
    analysing, release = threading.Event(), threading.Event()
    add = FleetIndex.add

    def slow_add(self: FleetIndex, record_id: str, run_id: str, text: str,
                 *args: object, **kwargs: object) -> None:
        if "bulky" in text:
            analysing.set()
            assert release.wait(30)
        add(self, record_id, run_id, text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FleetIndex, "add", slow_add)
    _write(database, ["a bulky note for fleet f"])
    searching_f = threading.Thread(target=lambda: index.search("f", "bulky", "lexical"))
    searching_f.start()
    try:
        assert analysing.wait(30)
        answered: list[object] = []
        searching_g = threading.Thread(
            target=lambda: answered.append(index.search("g", "garden", "lexical")))
        searching_g.start()
        searching_g.join(10)
        assert answered and answered[0], "fleet g's search waited for fleet f's analysis"
    finally:
        release.set()
        searching_f.join(30)
    assert index.search("f", "bulky", "lexical")


# -- a save copies each fleet under its lock and pickles the copy after letting go ---------

NOTES = {"n0": "the pond pump hums at night", "n1": "the pond pump was cleaned in may",
         "n2": "a heron visited the pond", "n3": "the heron left the pond at dawn",
         "n4": "the pond pump hums at night"}
"""Records of run "notes" added to fleet f directly; n4 repeats n0's text (its text key)."""
POND = DocFacts(agent_id="a", tags=("garden",), metadata={"place": "pond"})


def _add_note(index: FleetIndex, record_id: str) -> None:
    key = hashlib.sha256(NOTES[record_id].encode()).digest()[:16]
    index.add(record_id, "notes", NOTES[record_id], key, facts=POND)


def _plain(value: object) -> object:
    if isinstance(value, np.ndarray):
        return str(value.dtype), value.shape, value.tolist()
    return value


def _held(index: FleetIndex) -> dict[str, object]:
    """Everything a snapshot of ``index`` holds, as plain values (arrays as lists)."""
    state = index.__getstate__()
    held = {name: _plain(value) for name, value in state.items() if name != "lexical"}
    lexical = index.lexical.__getstate__()
    held["lexical"] = {name: _plain(value) for name, value in lexical.items()}
    return held


def test_a_save_writes_each_fleet_as_it_was_copied_whatever_changes_it_after(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fleet f is copied under its lock; before its copy is pickled, another thread (under
    that lock, free again) adds a record that extends its run neighbours (sums into their
    postings in place, appends to a tag's, a metadata pair's and a text key's lists, writes
    the link arrays) and erases one in place (a hole in ``ids``, postings dropped). The file
    holds f as it was when copied: this fails when the pickling reads the live index."""
    path = tmp_path / "index.snapshot"
    index = SearchIndex(database, None, snapshot_path=path)
    index.warm_up()
    slot = index._fleets["f"]
    with slot.lock:
        for record_id in ("n0", "n1", "n2", "n3"):
            _add_note(slot.index, record_id)
    real_frame = snapshot_module.fleet_frame
    when_copied: list[dict[str, object]] = []

    def change_f() -> None:
        with slot.lock:
            _add_note(slot.index, "n4")
            needed = slot.index.removal_texts(["n1"])
            assert slot.index.in_place_allowed(["n1"])
            slot.index.remove(["n1"], {record_id: NOTES[record_id] for record_id in needed})

    def frame_after_changes(fleet_id: str, copy: object) -> tuple[str, bytes]:
        if fleet_id == "f":
            when_copied.append(_held(pickle.loads(real_frame("f", slot.index)[1])))
            changer = threading.Thread(target=change_f)
            changer.start()
            changer.join(30)
            assert not changer.is_alive(), "fleet f's lock was held while it was pickled"
        return real_frame(fleet_id, copy)

    monkeypatch.setattr(index_module, "fleet_frame", frame_after_changes)
    index.save_snapshot()
    assert when_copied
    changed = _held(slot.index)
    assert changed != when_copied[0]  # the changes bite: the live index differs
    assert changed["lexical"] != when_copied[0]["lexical"]
    _, saved = read_snapshot(path, repr(ContextSettings()))
    assert _held(saved["f"]) == when_copied[0]
    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert restarted.search("f", "pump cleaned", "lexical")  # n1, as it was when copied


def test_a_copy_refuses_an_attribute_it_has_no_rule_for() -> None:
    index = FleetIndex(0, ContextSettings())
    index.snapshot_copy()
    index.cache = {}  # type: ignore[attr-defined]  # a new attribute, shared if copied blindly
    with pytest.raises(TypeError, match="cache"):
        index.snapshot_copy()


@pytest.mark.parametrize("slow", ["pickling", "writing"])
def test_a_fleet_is_searched_while_its_own_copy_is_pickled_and_written(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """The save of fleet f is held (its pickling, or the file's writing) until the test lets
    it go: a search of f and a write to f go through meanwhile. Before, f was pickled under
    f's lock: the search waited for the whole pickling."""
    path = tmp_path / "index.snapshot"
    index = SearchIndex(database, None, snapshot_path=path)
    index.warm_up()
    held, release = threading.Event(), threading.Event()
    real_frame, real_write = snapshot_module.fleet_frame, snapshot_module.write_snapshot

    def slow_frame(fleet_id: str, copy: object) -> tuple[str, bytes]:
        if fleet_id == "f" and slow == "pickling":
            held.set()
            assert release.wait(30)
        return real_frame(fleet_id, copy)

    def slow_write(*args: object) -> None:
        if slow == "writing":
            held.set()
            assert release.wait(30)
        real_write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(index_module, "fleet_frame", slow_frame)
    monkeypatch.setattr(index_module, "write_snapshot", slow_write)
    saver = threading.Thread(target=index.save_snapshot)
    saver.start()
    try:
        assert held.wait(30)
        found: list[list[tuple[str, float]]] = []
        searcher = threading.Thread(target=lambda: (
            found.append(index.search("f", "garden hose", "lexical")),
            _write(database, ["a brand new tulip bed"]),
            found.append(index.search("f", "tulip bed", "lexical"))))
        searcher.start()
        searcher.join(30)
        assert not searcher.is_alive(), f"a search of fleet f waited for its {slow}"
        assert len(found) == 2 and all(found)
        assert saver.is_alive()  # the save was still held: the search did not come after it
    finally:
        release.set()
        saver.join(30)
    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert _answers(restarted) == _rebuilt(database)


def test_a_bm25_copy_pickles_as_the_index_was_when_copied() -> None:
    """GrowingBM25.snapshot_copy keeps the weights (summed into in place later) and each
    term's document array with its length then (appended to past that length later, or
    replaced by a merge or a drop): what the copy pickles as is the index at copy time."""
    bm25 = GrowingBM25()
    for bag in ({"lake": 1.0, "boat": 1.0}, {"boat": 2.0}, {"dock": 1.0}, {"lake": 1.0}):
        bm25.add(bag)
    bm25.extend(0, {"dock": 0.5})  # set aside (late): merged by the copy
    when_copied = {name: _plain(value) for name, value in bm25.__getstate__().items()}
    copy = bm25.snapshot_copy()
    bm25.extend(1, {"lake": 0.4, "boat": 0.3})  # a sum in place, a late entry
    bm25.add({"boat": 1.0, "lake": 1.0, "oar": 1.0})  # appends past the copied lengths
    bm25.drop([2], holes=[2])  # new arrays for "dock"
    bm25.refill([])
    assert {name: _plain(value) for name, value in bm25.__getstate__().items()} != when_copied
    loaded = pickle.loads(pickle.dumps(copy))
    assert {name: _plain(value) for name, value in loaded.__getstate__().items()} == when_copied
