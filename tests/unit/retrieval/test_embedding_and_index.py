from __future__ import annotations

import numpy as np
import pytest

from services.shard.retrieval.embedding import (
    BertEmbedder,
    HashEmbedder,
    TestEmbedderRefused,
    require_production,
)
from services.shard.retrieval.vector_index import (
    ExactVectorIndex,
    HnswVectorIndex,
    TieredVectorIndex,
    recall_against,
)


def test_hash_embedder_is_deterministic_normalised_and_refused_in_production() -> None:
    embedder = HashEmbedder(32)
    first = embedder.embed(["the cat sat", "a dog ran"])
    again = embedder.embed(["the cat sat", "a dog ran"])
    assert np.array_equal(first, again)
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0)
    with pytest.raises(TestEmbedderRefused, match="tests only"):
        require_production(embedder, allow_test_embedder=False)
    require_production(embedder, allow_test_embedder=True)


@pytest.fixture(scope="module")
def minilm() -> BertEmbedder:
    return BertEmbedder()


def test_minilm_matches_the_reference_model_on_known_pairs(minilm: BertEmbedder) -> None:
    vectors = minilm.embed(
        [
            "A man is playing a guitar.",
            "Someone plays an instrument.",
            "The stock market fell today.",
        ]
    )
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    related, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert related > 0.4 > unrelated
    require_production(minilm, allow_test_embedder=False)


def test_minilm_batch_order_and_padding_do_not_change_vectors(minilm: BertEmbedder) -> None:
    texts = [
        "short",
        "a much longer sentence with quite a few more tokens in it",
        "medium length text",
    ]
    together = minilm.embed(texts)
    alone = np.vstack([minilm.embed([t]) for t in texts])
    assert np.allclose(together, alone, atol=1e-5)


def _clustered(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, dim))
    rows = centres[rng.integers(0, 20, n)] + 0.5 * rng.normal(size=(n, dim))
    out: np.ndarray = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    return out


def test_exact_index_returns_true_neighbours_and_replaces_on_same_key() -> None:
    data = _clustered(300, 16, 1)
    index = ExactVectorIndex(16)
    index.add(list(range(300)), data)
    sims = data @ data[7]
    expected = [int(i) for i in np.argsort(-sims)[:5]]
    assert [k for k, _ in index.search(data[7], 5)] == expected
    index.add([7], data[8:9])
    assert len(index) == 300
    assert index.search(data[8], 2)[0][1] == pytest.approx(1.0, abs=1e-5)


def test_exact_index_looks_up_vectors_by_key_in_any_order_and_refuses_unknown_keys() -> None:
    data = _clustered(50, 8, 4)
    index = ExactVectorIndex(8)
    keys = [5000, 3, 17, *range(20, 67)]  # sparse and out of order: rows follow insertion
    index.add(keys, data)
    asked = np.array([17, 5000, 3, 17], dtype=np.int64)
    assert np.array_equal(index.vectors(asked), data[[2, 0, 1, 2]])
    assert np.array_equal(index.vectors([66]), data[[49]])
    for unknown in ([4], [5001], [-1], [3, 10_000_000]):
        with pytest.raises(KeyError):
            index.vectors(unknown)
    with pytest.raises(ValueError, match="non-negative"):
        index.add([-2], data[:1])


def test_dots_are_each_keys_cosine_in_the_order_asked_for_float32_and_float16_rows() -> None:
    """Float16 rows are scored by usearch's kernel, not widened in numpy first: the same
    cosines (the query is rounded to float16 too), in the keys' order, repeats included."""
    data = _clustered(300, 384, 5)
    query = data[11]
    asked = np.array([17, 250, 3, 17, 299, 0], dtype=np.int64)
    for dtype, tolerance in ((np.float32, 1e-6), (np.float16, 1e-4)):
        index = ExactVectorIndex(384, dtype=dtype)
        index.add(list(range(300)), data)
        dots = index.dots(asked, query)
        assert dots.dtype == np.float32
        assert np.allclose(dots, data[asked] @ query, atol=tolerance)
        assert np.allclose(dots, index.vectors(asked) @ query, atol=tolerance)
        assert index.dots(np.array([], dtype=np.int64), query).shape == (0,)
        with pytest.raises(KeyError):
            index.dots([4, 300], query)


def test_hnsw_recall_against_exact_is_high() -> None:
    data = _clustered(2000, 32, 2)
    exact, hnsw = ExactVectorIndex(32), HnswVectorIndex(32)
    exact.add(list(range(2000)), data)
    hnsw.add(list(range(2000)), data)
    assert recall_against(exact, hnsw, data[:50], 10) >= 0.95


def test_tiered_index_switches_to_hnsw_past_threshold_and_keeps_results() -> None:
    data = _clustered(120, 16, 3)
    tiered = TieredVectorIndex(16, threshold=100)
    tiered.add(list(range(90)), data[:90])
    assert not tiered.approximate
    tiered.add(list(range(90, 120)), data[90:])
    assert tiered.approximate and len(tiered) == 120
    assert tiered.search(data[110], 1)[0][0] == 110
    # Past the threshold vectors are held as float16: cosines within 1e-3 of float32.
    stored = tiered.vectors([3, 110])
    assert stored.dtype == np.float32
    assert np.allclose(stored, data[[3, 110]], atol=1e-3)
    assert np.allclose(tiered.dots([3, 110], data[110]), data[[3, 110]] @ data[110], atol=1e-3)
    # The graph (bfloat16) finds what an exact scan finds; its hits' cosines are the float16
    # copy's, best first (a threshold such as semantic dedup's 0.97 compares them).
    exact = ExactVectorIndex(16)
    exact.add(list(range(120)), data)
    assert recall_against(exact, tiered, data[:40], 5) >= 0.95
    hits = tiered.search(data[7], 10)
    keys = [key for key, _ in hits]
    assert [sim for _, sim in hits] == pytest.approx(tiered.dots(keys, data[7]).tolist(), abs=0)
    assert [sim for _, sim in hits] == sorted((sim for _, sim in hits), reverse=True)


def test_tiered_index_is_exact_again_once_removals_take_it_below_half_its_threshold() -> None:
    """Erasures shrink a fleet: below half the threshold its searches scan exactly again
    (before, the graph, holding its removed nodes as filler, served it for good)."""
    data = _clustered(120, 16, 3)
    tiered = TieredVectorIndex(16, threshold=100)
    tiered.add(list(range(120)), data)
    tiered.remove(list(range(70)))  # 50 left: half the threshold, still a graph
    assert tiered.approximate and len(tiered) == 50
    tiered.remove([70])
    assert not tiered.approximate and len(tiered) == 49
    exact = ExactVectorIndex(16)
    exact.add(list(range(71, 120)), data[71:])
    for query in data[60:80]:
        assert [k for k, _ in tiered.search(query, 5)] == [k for k, _ in exact.search(query, 5)]
    assert np.allclose(tiered.vectors([71, 119]), data[[71, 119]], atol=1e-3)
    tiered.remove([71])
    assert tiered.search(data[71], 1)[0][0] != 71
    tiered.add(list(range(200, 251)), data[:51])  # grows on: 99, still exact
    assert not tiered.approximate and len(tiered) == 99
    tiered.add([251], data[51:52])  # and is a graph again at the threshold
    assert tiered.approximate and len(tiered) == 100


def test_float16_hnsw_recall_against_exact_is_high() -> None:
    data = _clustered(2000, 32, 2)
    exact, tiered = ExactVectorIndex(32), TieredVectorIndex(32, threshold=1000)
    exact.add(list(range(2000)), data)
    tiered.add(list(range(2000)), data)
    assert tiered.approximate
    assert recall_against(exact, tiered, data[:50], 10) >= 0.95
