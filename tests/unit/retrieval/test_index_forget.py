"""SearchIndex.forget after an erasure: the fleet's index is rebuilt without the erased
records (and the terms they lent their run neighbours), other fleets are untouched, a second
call costs nothing, and the saved snapshot still matches the store, so the next start loads
it instead of rebuilding."""

from __future__ import annotations

import errno
import math
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import delete

from services.common.db import Database
from services.shard.retrieval.embedding import HashEmbedder
from services.shard.retrieval.lexical import GrowingBM25
from services.shard.search.fleet_index import (
    ContextSettings,
    DocFacts,
    DocFilter,
    FleetIndex,
    metadata_day,
    terms_of,
)
from services.shard.search.index import SearchIndex, text_key
from services.shard.search.snapshot import READABLE, fleet_frame, temporary_of
from services.shard.tables import RECORDS
from tests.unit.retrieval.test_index_snapshot import OTHER, _store, _write

TEXTS = ["the vault combination is four eight fifteen", "the next step of the same run",
         "an unrelated note about gardens"]


def _erase(database: Database, record_id: str) -> None:
    with database.session() as session:  # what the eraser does to the records table
        session.execute(delete(RECORDS).where(RECORDS.c.id == record_id))


def _indexed(tmp_path: Path, texts: list[str],
             query: str) -> tuple[Database, SearchIndex, str]:
    """``texts`` stored in fleet f and indexed (snapshot at index.snapshot); the store, the
    index and the record ``query`` ranks first."""
    database = _store(tmp_path / "shard.db")
    _write(database, texts)
    index = SearchIndex(database, None, snapshot_path=tmp_path / "index.snapshot")
    index.warm_up()
    return database, index, index.search("f", query, "lexical")[0][0]


def test_forget_rebuilds_the_fleet_and_the_snapshot_stays_loadable(tmp_path: Path) -> None:
    database, index, secret = _indexed(tmp_path, TEXTS, "vault combination")
    _write(database, ["the vault in another fleet"], OTHER)
    path = tmp_path / "index.snapshot"
    assert len(index.search("f", "vault combination", "lexical")) >= 2  # neighbours share it

    _erase(database, secret)
    assert index.forget("f", [secret])
    assert index.search("f", "vault combination", "lexical") == []
    assert index.search("g", "vault", "lexical")  # the other fleet untouched
    assert not index.forget("f", [secret])  # idempotent: nothing left to drop
    assert b"combin" not in path.read_bytes()  # its stem: the index holds stems

    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert restarted.search("f", "vault combination", "lexical") == []
    assert ([restarted.search("f", q, "lexical") for q in ("next step", "gardens")]
            == [index.search("f", q, "lexical") for q in ("next step", "gardens")])


def test_the_fleet_is_searched_while_it_is_rebuilt_and_keeps_what_arrived(
        tmp_path: Path) -> None:
    database, index, secret = _indexed(tmp_path, TEXTS, "vault combination")
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


RUN = ["we met at the lake on monday", "the boat was painted blue", "the vault code is zqxwvt",
       "the boat sank near the dock", "lunch at the lake house", "the dock needs repair",
       "a storm hit the lake", "the boat was insured", "repairs start next week",
       "the insurance paid for the boat", "the lake froze in winter", "skating on the lake"]
RUN_QUERIES = ["boat lake", "dock repair", "vault code", "insurance", "storm winter"]


def _never_rebuilt(*args: object) -> object:
    raise AssertionError("the fleet was rebuilt")


def test_forget_removes_in_place_as_a_rebuild_would(tmp_path: Path) -> None:
    database, index, secret = _indexed(tmp_path, RUN, "zqxwvt")
    path = tmp_path / "index.snapshot"
    assert len(index.search("f", "zqxwvt", "lexical")) == 5  # four neighbours share it

    _erase(database, secret)
    index._rebuilt = _never_rebuilt  # type: ignore[method-assign]
    assert index.forget("f", [secret])
    assert index.search("f", "zqxwvt", "lexical") == []
    assert index.records() == len(RUN) - 1
    assert b"zqxwvt" not in path.read_bytes() and secret.encode() not in path.read_bytes()
    rebuilt = SearchIndex(database, None)
    rebuilt.warm_up()
    answers = [index.search("f", q, "lexical") for q in RUN_QUERIES]
    assert answers == [rebuilt.search("f", q, "lexical") for q in RUN_QUERIES]

    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert [restarted.search("f", q, "lexical") for q in RUN_QUERIES] == answers


def test_forget_rebuilds_when_a_neighbours_text_is_gone_from_the_store(tmp_path: Path) -> None:
    database, index, secret = _indexed(tmp_path, RUN, "zqxwvt")
    neighbour = next(rid for rid, _ in index.search("f", "painted", "lexical") if rid != secret)
    _erase(database, secret)
    _erase(database, neighbour)  # erased meanwhile: its own forget has not come yet
    rebuilds: list[object] = []
    build = index._rebuilt

    def counted(*args: object) -> object:
        rebuilds.append(args)
        return build(*args)  # type: ignore[arg-type]

    index._rebuilt = counted  # type: ignore[method-assign]
    assert index.forget("f", [secret])
    assert rebuilds and index.records() == len(RUN) - 2
    assert index.search("f", "zqxwvt painted", "lexical") == []


def test_a_removal_that_fails_leaves_the_fleet_and_its_count_as_they_were(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store read for the neighbours' texts fails: nothing is removed or uncounted (the
    saved snapshot's record count stays true), and the next forget removes them."""
    database, index, secret = _indexed(tmp_path, RUN, "zqxwvt")
    _erase(database, secret)
    read = index.repo.texts_by_ids

    def unavailable(*args: object) -> object:
        raise OSError("the database went away")

    monkeypatch.setattr(index.repo, "texts_by_ids", unavailable)
    with pytest.raises(OSError):
        index.forget("f", [secret])
    assert index.records() == len(RUN) and index._handed == len(RUN)
    monkeypatch.setattr(index.repo, "texts_by_ids", read)
    assert index.forget("f", [secret])
    assert index.records() == len(RUN) - 1 and index._handed == len(RUN) - 1
    assert index.search("f", "zqxwvt", "lexical") == []


def test_a_snapshot_that_cannot_be_saved_after_an_erasure_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk at the save that follows an erasure: the old snapshot (and a half-written
    copy) held the erased record's terms on disk until the next save, which could be far
    off. Now it is removed; the erasure itself stands, and the next start rebuilds from the
    store (before, the file still held 'combin', the stem of 'combination', here)."""
    database, index, secret = _indexed(tmp_path, TEXTS, "vault combination")
    path = tmp_path / "index.snapshot"
    assert b"combin" in path.read_bytes()  # the stem of "combination"
    temporary_of(path).write_bytes(path.read_bytes())  # an earlier save cut short
    _erase(database, secret)

    def full_disk(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("services.shard.search.index.write_snapshot", full_disk)
    assert index.forget("f", [secret])  # not an error: nothing erased is left anywhere
    assert not path.exists() and not temporary_of(path).exists()
    assert index.search("f", "vault combination", "lexical") == []

    monkeypatch.undo()  # space again: the next save writes a snapshot without the erased text
    index._save_if_grown()
    assert path.exists() and b"combin" not in path.read_bytes()
    restarted = SearchIndex(database, None, snapshot_path=path)
    restarted.warm_up()
    assert restarted.loaded_from_snapshot
    assert restarted.search("f", "vault combination", "lexical") == []


def test_an_erasure_before_the_index_is_ready_removes_the_snapshot_it_loaded(
        tmp_path: Path) -> None:
    """Not ready yet (a start still catching up): no save can run, so the loaded snapshot,
    which holds the erased terms, is removed rather than kept until the next save."""
    database, index, secret = _indexed(tmp_path, TEXTS, "vault combination")
    path = tmp_path / "index.snapshot"
    _erase(database, secret)
    index._ready.clear()
    assert index.forget("f", [secret])
    assert not path.exists()


# -- in place: the same index a rebuild from the remaining records gives --------------------

WORDS = ["lake", "boat", "river", "garden", "hose", "deploy", "pipeline", "schema", "migration",
         "revenue", "quarter", "budget", "kids", "school", "dinner", "recipe", "trip", "flight",
         "hotel", "weather", "storm", "doctor", "visit", "piano", "lesson", "camera", "photo",
         "market", "price", "vault", "key"]
DATES = ("13 October 2023", "2 June 2023", "20 May 2022")
QUERY_TEXTS = ("lake boat", "deploy pipeline migration", "garden hose weather", "vault key",
               "revenue budget quarter", "piano lesson on 13 October, 2023", "trip in June",
               "doctor visit in 2022", "dinner recipe kids", "storm flight hotel price")
FILTERS = (None, DocFilter(run_id="run-1"), DocFilter(run_id=""), DocFilter(agent_id="ann"),
           DocFilter(domain="home"), DocFilter(tags_any=("blue", "green")),
           DocFilter(tags_all=("blue",)), DocFilter(metadata=(("place", "paris"),)),
           DocFilter(created_before_us=1_000_030), DocFilter(min_importance=0.5))
NEW = HashEmbedder(64)
OLD = HashEmbedder(32)  # a previous model's vectors, for the records not re-embedded yet


@dataclass(frozen=True)
class _Row:
    id: str
    run: str
    text: str
    agent: str
    tags: tuple[str, ...]
    metadata: dict[str, str]
    created_us: int
    importance: float
    marker: str  # a word no other record has

    def add_to(self, index: FleetIndex) -> int:
        facts = DocFacts(self.agent, "home" if self.agent == "ann" else "ops", self.tags,
                         self.metadata, self.created_us, self.importance)
        return index.add(self.id, self.run, self.text, text_key(self.text, self.run, self.agent),
                         metadata_day(self.metadata, self.created_us), facts)


def _marker(rng: np.random.Generator) -> str:
    return "".join(rng.choice(list("bcdfghjklmnpqrstvwxz"), 9).tolist())


def _rows(rng: np.random.Generator, count: int, start: int = 0) -> list[_Row]:
    rows: list[_Row] = []
    for n in range(start, start + count):
        run = str(rng.choice(["run-1", "run-2", "run-3", "run-4", ""], p=[.3, .25, .2, .1, .15]))
        agent = str(rng.choice(["ann", "bob"]))
        marker = _marker(rng)
        text = " ".join(rng.choice(WORDS, int(rng.integers(2, 7))).tolist())
        earlier = [r for r in rows if r.run == run and r.agent == agent]
        if earlier and rng.random() < 0.2:  # the same text again: it shares a text key
            text = earlier[int(rng.integers(len(earlier)))].text
        else:
            text = f"{text} {marker}" + ("?" if rng.random() < 0.2 else "")
        metadata = {"place": str(rng.choice(["paris", "rome"]))}
        if rng.random() < 0.4:
            metadata["session"] = str(rng.choice(DATES))
        if rng.random() < 0.3:
            metadata[f"note-{marker}"] = marker
        tags = tuple(rng.choice(["blue", "green", "red"], int(rng.integers(0, 3))).tolist())
        if rng.random() < 0.3:
            tags += (f"tag-{marker}",)
        rows.append(_Row(f"rec-{n:04d}", run, text, agent, tags, metadata, 1_000_000 + n,
                         float(rng.choice([0.2, 0.5, 0.9])), marker))
    return rows


def _built(rows: list[_Row]) -> FleetIndex:
    index = FleetIndex(NEW.dimension, ContextSettings())
    _grow(index, rows)
    return index


def _grow(index: FleetIndex, rows: list[_Row]) -> None:
    docs = [row.add_to(index) for row in rows]
    texts = [row.text for row in rows]
    # Every third record waits for the new model: it ranks by its previous model's vector.
    newer = [i for i in range(len(rows)) if int(rows[i].id[4:]) % 3]
    if newer:
        index.add_vectors([docs[i] for i in newer], NEW.embed([texts[i] for i in newer]))
    index.add_previous_vectors(docs, OLD.embed(texts))


def _answers(index: FleetIndex, vectors: bool = True) -> list[list[tuple[str, float]]]:
    out = []
    for query in QUERY_TEXTS:
        vector = NEW.embed([query])[0] if vectors else None
        previous = OLD.embed([query])[0] if vectors else None
        for flt in FILTERS:
            allowed = index.mask(flt) if flt is not None else None
            for mode in ("lexical", "semantic", "hybrid") if vectors else ("lexical",):
                found = index.search(query, vector, mode, allowed, previous)
                out.append([(index.ids[doc], score) for doc, score in found])
    return out


def _assert_same_answers(got: list[list[tuple[str, float]]],
                         want: list[list[tuple[str, float]]]) -> None:
    """The same ranked ids with scores within 1e-6 (relative, for BM25's larger scores); two
    records may trade places only where their scores tie within that."""
    assert len(got) == len(want)
    for got_one, want_one in zip(got, want, strict=True):
        assert len(got_one) == len(want_one), (got_one, want_one)
        want_score = dict(want_one)
        for (got_id, got_s), (want_id, want_s) in zip(got_one, want_one, strict=True):
            assert math.isclose(got_s, want_s, rel_tol=1e-6, abs_tol=1e-6), (got_one, want_one)
            if got_id != want_id:
                assert got_id in want_score, (got_one, want_one)
                assert math.isclose(want_score[got_id], want_s, rel_tol=1e-6, abs_tol=1e-6)


def _structure(index: FleetIndex) -> dict[str, object]:
    """What the answers rest on besides scores, by record id."""
    live = [d for d, rid in enumerate(index.ids) if rid]
    docs = np.asarray(live, dtype=np.int64)
    near = index.neighbours(docs) if live else np.zeros((0, 0), dtype=np.int64)
    return {
        "ids": [index.ids[d] for d in live], "len": len(index),
        "neighbours": {index.ids[d]: [index.ids[n] if n >= 0 else None for n in row]
                       for d, row in zip(live, near.tolist(), strict=True)},
        "text_keys": dict(index.text_keys),
        "masks": [sorted(index.ids[d] for d in np.flatnonzero(m)) if m is not None else None
                  for m in (index.mask(f) if f is not None else None for f in FILTERS)],
        "vocabulary": len(index.lexical._postings), "bm25_docs": len(index.lexical),
        "vectors": index.indexed_vectors(),
        "previous": len(index.previous) if index.previous is not None else 0,
        "run_tails": [(run, [(index.ids[d], own) for d, own in tail])
                      for run, tail in index._run_tail.items()],  # in their LRU order
        "last_of_run": {run: index.ids[d] for run, d in index._last_of_run.items()},
    }


def _erasable(rng: np.random.Generator, rows: list[_Row]) -> set[str]:
    """A random subset, and the first, a middle and the last record of a run, a whole run,
    and a text key's first holder while a later record holds the key too."""
    chosen = {r.id for r in rows if rng.random() < 0.08}
    run = [r.id for r in rows if r.run == "run-2"]
    if run:
        chosen |= {run[0], run[len(run) // 2], run[-1]}
    chosen |= {r.id for r in rows if r.run == "run-4"}
    seen: dict[tuple[str, str, str], str] = {}
    for row in rows:
        key = (row.run, row.agent, row.text)
        if key in seen:
            chosen.add(seen[key])
            break
        seen[key] = row.id
    return chosen


def _remove_in_place(index: FleetIndex, rows: list[_Row], erased: set[str]) -> None:
    texts = {r.id: r.text for r in rows}
    needed = index.removal_texts(erased)
    assert not set(needed) & erased
    index.remove(erased, {i: texts[i] for i in needed})


@pytest.mark.parametrize("seed", range(12))
def test_removal_in_place_answers_as_a_rebuild_from_the_remaining_records(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = _rows(rng, 60)
    index = _built(rows)
    first = _erasable(rng, rows)
    _remove_in_place(index, rows, first)
    kept = [r for r in rows if r.id not in first]
    _assert_same_answers(_answers(index), _answers(_built(kept)))
    assert _structure(index) == _structure(_built(kept))

    # Holes stay holes as the fleet grows and shrinks again: later records join the runs
    # (their tails, last records and text keys), a second erasure, a snapshot round trip.
    later = _rows(rng, 15, start=len(rows))
    _grow(index, later)
    rows += later
    second = {r.id for r in rows if r.id not in first and rng.random() < 0.15}
    _remove_in_place(index, rows, second)
    kept = [r for r in rows if r.id not in first | second]
    rebuilt = _built(kept)
    _assert_same_answers(_answers(index), _answers(rebuilt))
    assert _structure(index) == _structure(rebuilt)

    restored = pickle.loads(pickle.dumps(index))
    _assert_same_answers(_answers(restored, vectors=False), _answers(rebuilt, vectors=False))
    more = _rows(rng, 5, start=len(rows))
    for fleet in (restored, rebuilt):
        for row in more:
            row.add_to(fleet)
    _assert_same_answers(_answers(restored, vectors=False), _answers(rebuilt, vectors=False))


@pytest.mark.parametrize("seed", range(4))
def test_a_snapshot_after_removal_in_place_holds_nothing_of_the_erased_records(
        seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    rows = _rows(rng, 60)
    index = _built(rows)
    erased = _erasable(rng, rows)
    _remove_in_place(index, rows, erased)
    blob = fleet_frame("f", index)[1]
    gone = [r for r in rows if r.id in erased]
    kept_text = " ".join(r.text for r in rows if r.id not in erased)
    for row in gone:
        assert row.id.encode() not in blob
        unique = [row.marker, *terms_of(row.marker)]
        if row.marker in kept_text:  # a duplicate text kept under another record
            continue
        for word in unique:
            assert word.encode() not in blob, (row, word)
    assert any(r.marker.encode() in blob for r in rows if r.id not in erased)  # the check bites


def test_in_place_is_refused_once_run_tails_were_let_go() -> None:
    """A run that lost its kept tail (more open runs than ``max_open_runs``) shared no terms
    with its next record; a rebuild decides again which runs those are."""
    index = FleetIndex(0, ContextSettings(max_open_runs=2))
    for n, run in enumerate(["a", "b", "c", "a"]):
        index.add(f"r{n}", run, f"note {n} about {run}")
    assert not index.in_place_allowed(["r1"])
    small = FleetIndex(0, ContextSettings())
    for n in range(20):
        small.add(f"r{n}", "a", f"note {n}")
    assert small.in_place_allowed(["r1"])
    assert not small.in_place_allowed([f"r{n}" for n in range(6)])  # a large share: rebuild


def test_a_format_3_snapshot_loads_and_its_fleet_is_rebuilt_at_the_first_erasure() -> None:
    """Format 3 kept no holes and no later holders of text keys: it loads and answers as
    before, and an erasure rebuilds the fleet rather than guess the keys' next holders."""
    rows = _rows(np.random.default_rng(5), 40)
    index = _built(rows)
    state = index.__getstate__()
    del state["_key_later"]
    lexical_state = index.lexical.__getstate__()
    del lexical_state["holes"]
    lexical = GrowingBM25.__new__(GrowingBM25)
    lexical.__setstate__(lexical_state)
    loaded = FleetIndex.__new__(FleetIndex)
    loaded.__setstate__({**state, "lexical": lexical})
    assert 3 in READABLE
    _assert_same_answers(_answers(loaded, vectors=False), _answers(index, vectors=False))
    assert index.in_place_allowed([rows[0].id])
    assert not loaded.in_place_allowed([rows[0].id])


@pytest.mark.parametrize("threshold", [10_000, 8], ids=["exact", "hnsw"])
def test_removed_vectors_leave_the_vector_index_and_the_others_keep_theirs(
        threshold: int) -> None:
    rows = _rows(np.random.default_rng(9), 30)
    index = FleetIndex(NEW.dimension, ContextSettings(), hnsw_threshold=threshold)
    docs = [row.add_to(index) for row in rows]
    vectors = NEW.embed([row.text for row in rows])
    index.add_vectors(docs, vectors)
    assert index.vectors.approximate == (threshold == 8)
    erased = {rows[3].id, rows[0].id, rows[-1].id}
    _remove_in_place(index, rows, erased)
    assert index.indexed_vectors() == len(rows) - len(erased)
    kept = [d for d, row in zip(docs, rows, strict=True) if row.id not in erased]
    assert np.allclose(index.vectors.vectors(kept), vectors[kept], atol=1e-3)  # float16 rows
    found = {index.ids[d] for d, _ in index.vectors.search(vectors[3], len(rows))}
    assert found == {row.id for row in rows} - erased


def test_a_refilled_document_extended_again_is_listed_once() -> None:
    """A document made again after a removal (its run's next record has not come yet) then
    gains terms from that record: each term still lists it once, with the sum."""
    bm25 = GrowingBM25()
    for bag in ({"lake": 1.0}, {"boat": 1.0}, {"dock": 1.0}):
        bm25.add(bag)
    bm25.drop([1], holes=[])
    bm25.refill([(1, [{"boat": 1.0, "oar": 1.0}])])
    bm25.extend(1, {"oar": 0.5, "lake": 0.4})
    docs, _ = bm25.sparse_scores({"oar": 1.0, "lake": 1.0})
    assert docs.tolist() == [0, 1]
    for term, listed in (("oar", [(1, 1.5)]), ("lake", [(0, 1.0), (1, 0.4)])):
        postings = bm25._postings[term]
        entries = zip(postings.doc_ids[: postings.size].tolist(),
                      postings.freqs[: postings.size].tolist(), strict=True)
        assert [(d, round(f, 5)) for d, f in entries] == listed


# -- found in review (2026-11-28): each checked failing before its fix -----------------------


def test_a_rebuild_that_drops_a_neighbour_erased_meanwhile_uncounts_it(tmp_path: Path) -> None:
    """Two neighbours erased at once: the first forget cannot read the neighbour's text and
    rebuilds, which drops the neighbour too; its own forget then finds nothing. The count
    (the snapshot header's) lost only the first, so the next start refused the snapshot."""
    database, index, secret = _indexed(tmp_path, RUN, "zqxwvt")
    neighbour = next(rid for rid, _ in index.search("f", "painted", "lexical") if rid != secret)
    _erase(database, secret)
    _erase(database, neighbour)
    assert index.forget("f", [secret])  # falls back to the rebuild
    index.forget("f", [neighbour])
    assert index.records() == len(RUN) - 2
    assert index._handed == len(RUN) - 2
    restarted = SearchIndex(database, None, snapshot_path=tmp_path / "index.snapshot")
    restarted.warm_up()
    assert restarted.loaded_from_snapshot


def test_a_record_read_before_its_erasure_and_handed_after_its_forget_stays_out(
        tmp_path: Path) -> None:
    """A catch-up reads a record, its erasure commits and is forgotten, then the catch-up
    hands the row over: it came back into the index (and the embedding queue)."""
    from tests.unit.retrieval.test_index_snapshot import _store, _write

    database = _store(tmp_path / "shard.db")
    _write(database, RUN)
    index = SearchIndex(database, None)
    index.warm_up()
    _write(database, ["the late secret is plmqkz"])
    read = index.repo.texts_after
    late: list[str] = []

    def read_then_erased(*args: object, **kw: object) -> object:
        rows = read(*args, **kw)  # type: ignore[arg-type]
        for row in rows:
            if "plmqkz" in row.content:
                _erase(database, row.id)  # its erasure commits ...
                late.append(row.id)
                index.forget("f", [row.id])  # ... and its forget runs
        return rows

    index.repo.texts_after = read_then_erased  # type: ignore[method-assign]
    index.sync()
    index.repo.texts_after = read  # type: ignore[method-assign]
    assert late
    assert index.search("f", "plmqkz", "lexical") == []
    assert late[0] not in [item[2] for item in index._pending]
    assert index._handed == index.records() == len(RUN)
    assert not index._erased_recent  # let go once the read ended


def test_a_record_erased_while_its_vector_is_embedded_does_not_stall_the_indexer(
        tmp_path: Path) -> None:
    """The batch the indexer had taken still held the erased record: storing its vector
    failed the foreign key, the batch went back whole, and every later round failed alike
    (no new record got a vector)."""
    from services.shard.retrieval.embedding import HashEmbedder
    from tests.unit.retrieval.test_index_snapshot import _store, _write

    database = _store(tmp_path / "shard.db")
    embedder = HashEmbedder(16)
    index = SearchIndex(database, embedder)
    index.warm_up()
    _write(database, RUN)
    index.sync()
    victim = index.search("f", "zqxwvt", "lexical")[0][0]
    embed = embedder.embed_background

    def erased_meanwhile(texts):  # type: ignore[no-untyped-def]
        _erase(database, victim)
        index.forget("f", [victim])
        return embed(texts)

    embedder.embed_background = erased_meanwhile  # type: ignore[method-assign]
    assert index.catch_up() == len(RUN)
    embedder.embed_background = embed  # type: ignore[method-assign]
    assert victim not in [item[2] for item in index._pending]
    assert index.lag() == 0
    _write(database, ["written after the erasure"])
    while index.catch_up():
        pass
    assert index.lag() == 0


def _bfloat16(vector: np.ndarray) -> bytes:
    """``vector`` as the graph holds it: bfloat16, float32 rounded to nearest even."""
    bits = vector.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def test_an_erased_vector_leaves_the_hnsw_graphs_memory() -> None:
    """usearch only marks a removed entry: its bytes stayed in the graph's memory."""
    from services.shard.retrieval.vector_index import TieredVectorIndex

    rng = np.random.default_rng(0)
    v = rng.standard_normal((40, 16)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    tiered = TieredVectorIndex(16, threshold=8)
    tiered.add(list(range(40)), v)
    tiered.remove([5, 7, 30])
    assert tiered._hnsw is not None and len(tiered) == 37
    graph = bytes(tiered._hnsw._index.save())  # what the usearch index holds in memory
    assert _bfloat16(v[6]) in graph  # the check bites
    for gone in (5, 7, 30):
        assert _bfloat16(v[gone]) not in graph
    assert tiered.search(v[6], 3)[0][0] == 6
    tiered.add([41], v[5:6])  # and it grows on as before
    assert len(tiered) == 38
