"""FleetIndex: run-neighbour context, growing BM25, candidate cut-off, run filter."""

from __future__ import annotations

import numpy as np

from services.shard.retrieval.embedding import HashEmbedder
from services.shard.retrieval.lexical import BM25Index, GrowingBM25
from services.shard.search.fleet_index import ContextSettings, FleetIndex


def test_growing_bm25_matches_a_bm25_built_with_the_final_documents() -> None:
    growing, final = GrowingBM25(k1=0.9, b=0.4), BM25Index(k1=0.9, b=0.4)
    growing.add({"dog": 1.0, "beach": 1.0})
    growing.add({"cat": 2.0})
    growing.extend(0, {"dog": 0.5, "sand": 1.0})
    final.add({"dog": 1.5, "beach": 1.0, "sand": 1.0})
    final.add({"cat": 2.0})
    query = {"dog": 1.0, "sand": 1.0, "cat": 1.0}
    assert np.allclose(growing.scores(query), final.scores(query))


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
