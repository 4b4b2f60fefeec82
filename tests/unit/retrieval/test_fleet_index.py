"""FleetIndex: run-neighbour context, growing BM25, candidate cut-off, run filter."""

from __future__ import annotations

import pickle
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import pytest

from services.shard.retrieval.embedding import HashEmbedder
from services.shard.retrieval.lexical import BM25Index, GrowingBM25
from services.shard.retrieval.text import MAX_QUERY_TERMS, DateMention
from services.shard.search.fleet_index import (
    MAX_QUERY_DATES,
    ContextSettings,
    FleetIndex,
    metadata_day,
    query_dates,
    terms_of,
)


def test_growing_bm25_matches_a_bm25_built_with_the_final_documents() -> None:
    growing, final = GrowingBM25(k1=0.9, b=0.4), BM25Index(k1=0.9, b=0.4)
    growing.add({"dog": 1.0, "beach": 1.0})
    growing.add({"cat": 2.0})
    growing.extend(0, {"dog": 0.5, "sand": 1.0})
    final.add({"dog": 1.5, "beach": 1.0, "sand": 1.0})
    final.add({"cat": 2.0})
    query = {"dog": 1.0, "sand": 1.0, "cat": 1.0}
    assert np.allclose(_dense(growing, query), final.scores(query))


def _dense(index: GrowingBM25, query: dict[str, float]) -> np.ndarray:
    """Every document's score (zero where nothing matches), to compare with BM25Index."""
    out = np.zeros(len(index), dtype=np.float32)
    docs, scores = index.sparse_scores(query)
    out[docs] = scores
    return out


def test_growing_bm25_sparse_scores_match_a_final_bm25_on_every_path() -> None:
    """Rare extended terms (sorted), common extended terms (dense pass), unextended terms;
    several terms' scores summed both ways (few matches: sorted; many: one dense row)."""
    rng = np.random.default_rng(7)
    growing, final = GrowingBM25(k1=0.9, b=0.4), BM25Index(k1=0.9, b=0.4)
    bags: list[dict[str, float]] = []
    for doc in range(400):
        bag = {f"w{int(t)}": 1.0 for t in rng.integers(0, 60, 4)}
        bag["common"] = 1.0
        bag[f"rare{doc % 100}"] = 1.0  # four documents each
        growing.add(bag)
        bags.append(dict(bag))
        if doc:  # each document extends the previous one, as a later neighbour does
            extra = {"common": 0.4, f"w{int(rng.integers(0, 60))}": 0.4}
            growing.extend(doc - 1, extra)
            for term, weight in extra.items():
                bags[doc - 1][term] = bags[doc - 1].get(term, 0.0) + weight
    for bag in bags:
        final.add(bag)
    for query in ({"w3": 1.0}, {"common": 1.0, "w5": 2.0}, {"w1": 1.0, "w2": 1.0, "nope": 1.0},
                  {"rare1": 1.0, "rare2": 0.5}):
        docs, scores = growing.sparse_scores(query)
        expected = final.scores(query)
        assert np.array_equal(docs, np.flatnonzero(expected))
        assert np.allclose(scores, expected[docs], rtol=1e-5)
        assert np.allclose(_dense(growing, query), expected, rtol=1e-5)
    assert len(growing.sparse_scores({"nope": 1.0})[0]) == 0


def test_growing_bm25_older_documents_gaining_terms_later_ones_have_score_exactly() -> None:
    """Extensions of any older document (summed in place, or set aside and merged by the next
    query), queried between extensions and after a pickle round trip (an index snapshot):
    the same scores as a BM25 built from the final documents, one entry per document."""
    rng = np.random.default_rng(19)
    growing = GrowingBM25(k1=0.9, b=0.4)
    bags: list[dict[str, float]] = []
    queries = ({"w1": 1.0}, {"w2": 1.0, "w7": 0.5}, {"common": 1.0, "w4": 1.0})
    for doc in range(300):
        bag = {f"w{int(t)}": 1.0 for t in rng.integers(0, 12, 3)} | {"common": 1.0}
        growing.add(bag)
        bags.append(dict(bag))
        for _ in range(2):  # an interleaved run's earlier record gains this one's terms
            older = int(rng.integers(0, doc + 1))
            extra = {f"w{int(t)}": 0.25 for t in rng.integers(0, 12, 2)}
            growing.extend(older, extra)
            for term, weight in extra.items():
                bags[older][term] = bags[older].get(term, 0.0) + weight
        if doc % 37 == 0:
            growing.sparse_scores(queries[doc % 3])  # merges what was set aside so far
    restored = pickle.loads(pickle.dumps(growing))
    final = BM25Index(k1=0.9, b=0.4)
    for bag in bags:
        final.add(bag)
    for index in (growing, restored):
        for query in queries:
            docs, scores = index.sparse_scores(query)
            expected = final.scores(query)
            assert np.array_equal(docs, np.flatnonzero(expected))
            assert np.allclose(scores, expected[docs], rtol=1e-5)
    postings = growing._postings["w1"]
    listed = postings.doc_ids[: postings.size]
    assert np.all(np.diff(listed) > 0)  # one entry per document, in order


def _index(rows: list[tuple[str, str, str]]) -> FleetIndex:
    embedder = HashEmbedder()
    index = FleetIndex(embedder.dimension, ContextSettings())
    docs = [index.add(rid, run, text) for rid, run, text in rows]
    index.add_vectors(docs, embedder.embed([text for _, _, text in rows]))
    return index


ROWS = [
    ("a", "run-1", "Where did you go last weekend?"),
    ("b", "run-1", "We drove up to the lake near Tahoe"),
    ("c", "run-1", "Sounds lovely, did the kids enjoy it?"),
    ("d", "run-2", "The deploy pipeline failed on the migration step"),
    ("e", "run-2", "Rolling back the schema change fixed it"),
]


def test_a_turn_is_found_through_its_neighbours_terms_within_its_run_only() -> None:
    index = _index(ROWS)
    found = [index.ids[d] for d, _ in index.search("lake", None, "hybrid")]
    assert found[0] == "b"
    assert {"a", "c"} <= set(found)  # neighbours of the lake turn share its terms
    assert not {"d", "e"} & set(found)  # another run shares nothing


def test_unrelated_query_returns_nothing_rather_than_every_record() -> None:
    index = _index(ROWS)
    vector = -HashEmbedder().embed(["zebra quantum"])[0]  # dissimilar to everything
    assert index.search("zebra quantum", vector, "hybrid") == []


def test_run_mask_limits_candidates_to_one_run() -> None:
    index = _index(ROWS)
    vector = HashEmbedder().embed(["schema lake"])[0]
    found = index.search("schema lake", vector, "hybrid", index.run_mask("run-2"))
    assert found and {index.ids[d] for d, _ in found} <= {"d", "e"}


def test_neighbour_links_follow_creation_order_within_a_run() -> None:
    index = _index(ROWS)
    near = index.neighbours(np.array([1, 3], dtype=np.int64))
    assert set(near[0][near[0] >= 0].tolist()) == {0, 2}
    assert set(near[1][near[1] >= 0].tolist()) == {4}


def test_a_query_naming_a_date_prefers_records_of_that_date() -> None:
    rows = [
        ("a", "run-1", "We painted a sunset together", date(2023, 7, 15)),
        ("b", "run-2", "We painted a lake together", date(2023, 10, 13)),
    ]
    embedder = HashEmbedder()
    index = FleetIndex(embedder.dimension, ContextSettings())
    docs = [index.add(rid, run, text, day=day) for rid, run, text, day in rows]
    vectors = embedder.embed([text for _, _, text, _ in rows])
    index.add_vectors(docs, vectors)
    between = (vectors[0] + vectors[1]) / np.linalg.norm(vectors[0] + vectors[1])  # no preference
    for mode in ("lexical", "hybrid"):
        vector = None if mode == "lexical" else between
        first = index.search("What was painted on October 13, 2023?", vector, mode)[0][0]
        assert index.ids[first] == "b"
        first = index.search("What was painted in July?", vector, mode)[0][0]
        assert index.ids[first] == "a"


def test_a_record_date_is_read_from_metadata_else_its_creation_day() -> None:
    assert metadata_day({"dia_id": "D1:3", "session_date": "1:56 pm on 8 May, 2023"}) == date(
        2023, 5, 8
    )
    created = int(datetime(2026, 11, 22, 12, tzinfo=UTC).timestamp() * 1_000_000)
    assert metadata_day({"note": "met in May"}, created) == date(2026, 11, 22)
    assert metadata_day({"when": "31 February, 2023"}) is None


def test_hybrid_prefers_a_statement_to_an_equally_relevant_question() -> None:
    rows = [
        ("q", "run-1", "Did you go camping at the lake?"),  # written first: wins ties otherwise
        ("s", "run-2", "We went camping at the lake."),
    ]
    embedder = HashEmbedder()
    vectors = embedder.embed([text for _, _, text in rows])
    between = (vectors[0] + vectors[1]) / np.linalg.norm(vectors[0] + vectors[1])
    for settings, first in (
        (ContextSettings(), "s"),
        (ContextSettings(statement_prior=0.0, length_prior=0.0), "q"),
    ):
        index = _indexed(rows, settings, embedder)
        found = index.search("camping lake", between, "hybrid")
        assert index.ids[found[0][0]] == first
        assert all(score > 0 for _, score in found)
    # Lexical mode ranks by BM25 alone (the priors were measured for hybrid only).
    lexical = index.search("camping lake", None, "lexical")
    assert {index.ids[d] for d, _ in lexical} == {"q", "s"}


def test_a_longer_record_wins_a_tie_in_hybrid() -> None:
    rows = [
        ("short", "run-1", "Pottery class."),
        ("long", "run-2", "Pottery class with my kids every Saturday morning at the studio."),
    ]
    embedder = HashEmbedder()
    index = _indexed(rows, ContextSettings(date_boost=0.0), embedder)
    scores = {index.ids[d]: s for d, s in index.search("pottery", None, "hybrid")}
    plain = _indexed(rows, ContextSettings(date_boost=0.0, length_prior=0.0), embedder)
    plain_scores = {plain.ids[d]: s for d, s in plain.search("pottery", None, "hybrid")}
    # BM25 favours the short record; the length prior narrows that gap.
    assert scores["long"] - scores["short"] > plain_scores["long"] - plain_scores["short"]


def _indexed(
    rows: list[tuple[str, str, str]], settings: ContextSettings, embedder: HashEmbedder
) -> FleetIndex:
    """(record id, run, text) rows added in order, each with its vector."""
    index = FleetIndex(embedder.dimension, settings)
    docs = [index.add(rid, run, text) for rid, run, text in rows]
    index.add_vectors(docs, embedder.embed([text for _, _, text in rows]))
    return index


def test_a_long_query_scores_its_rarest_terms_only_and_each_date_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review (2026-11-30): every term of a query was scored (an 8 KB query of 1,300
    common terms: 0.15 s at 10k records, under the fleet's lock) and every date mention made a
    pass over the matches ('2021 ' x 1,637: 0.13 s at 50k). At most MAX_QUERY_TERMS terms, the
    rarest, as the store's full-text search keeps; each date once, at most MAX_QUERY_DATES."""
    index = _index(ROWS)
    common = [f"filler{n}" for n in range(MAX_QUERY_TERMS + 20)]
    for n in range(len(common)):  # each word in many documents: common, costly to score
        index.add(f"f{n}", "run-9", " ".join(common))
    scored: list[set[str]] = []
    sparse = index.lexical.sparse_scores

    def watched(query: dict[str, float]) -> Any:
        scored.append(set(query))
        return sparse(query)

    monkeypatch.setattr(index.lexical, "sparse_scores", watched)
    found = index.search(" ".join([*common, "tahoe"]), None, "lexical")
    assert len(scored[-1]) == MAX_QUERY_TERMS
    assert set(terms_of("tahoe")) <= scored[-1]  # the rare term is kept
    assert "b" in {index.ids[d] for d, _ in found}
    assert query_dates("2021 " * 500) == [DateMention(2021, None, None)]
    assert len(query_dates(" ".join(str(1990 + n) for n in range(30)))) == MAX_QUERY_DATES
