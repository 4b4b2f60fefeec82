"""FleetIndex filters before ranking: the mask per condition, and dense search restricted to
the candidates (exact over few rows; the approximate index widened over many)."""

from __future__ import annotations

import numpy as np
import pytest

from services.shard.search import fleet_index
from services.shard.search.fleet_index import ContextSettings, DocFacts, DocFilter, FleetIndex


def _index(n: int, dimension: int = 16, hnsw_threshold: int = 10_000) -> FleetIndex:
    index = FleetIndex(dimension, ContextSettings(), hnsw_threshold=hnsw_threshold)
    for i in range(n):
        index.add(f"r{i}", "", f"note {i}", facts=DocFacts(
            agent_id=f"a{i % 3}", domain="technical" if i % 2 else "projects",
            tags=("even",) if i % 2 == 0 else ("odd", f"t{i % 5}"),
            metadata={"m": str(i % 4)}, created_us=1000 * i, importance=(i % 10) / 10))
    return index


def test_each_condition_narrows_the_mask() -> None:
    index = _index(40)
    docs = np.arange(40)

    def chosen(flt: DocFilter) -> set[int]:
        mask = index.mask(flt)
        assert mask is not None
        return set(np.flatnonzero(mask).tolist())

    assert index.mask(DocFilter()) is None
    assert chosen(DocFilter(agent_id="a1")) == {i for i in docs if i % 3 == 1}
    assert chosen(DocFilter(domain="projects")) == {i for i in docs if i % 2 == 0}
    assert chosen(DocFilter(tags_any=("even", "t1"))) == {
        i for i in docs if i % 2 == 0 or i % 5 == 1}
    assert chosen(DocFilter(tags_all=("odd", "t3"))) == {i for i in docs if i % 10 == 3}
    assert chosen(DocFilter(metadata=(("m", "1"),))) == {i for i in docs if i % 4 == 1}
    assert chosen(DocFilter(created_after_us=5000, created_before_us=9000)) == {6, 7, 8}
    assert chosen(DocFilter(min_importance=0.7)) == {i for i in docs if i % 10 >= 7}
    assert chosen(DocFilter(agent_id="nobody")) == set()
    assert chosen(DocFilter(metadata=(("m", "1"),), agent_id="a0")) == {
        i for i in docs if i % 4 == 1 and i % 3 == 0}


@pytest.mark.parametrize("exact_limit", [8192, 10])
def test_dense_search_returns_the_nearest_allowed(monkeypatch: pytest.MonkeyPatch,
                                                  exact_limit: int) -> None:
    monkeypatch.setattr(fleet_index, "EXACT_FILTERED", exact_limit)
    n, dimension = 3000, 16
    index = _index(n, dimension, hnsw_threshold=500)
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(n, dimension)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index.add_vectors(list(range(n)), vectors)
    allowed = index.mask(DocFilter(metadata=(("m", "1"),), tags_all=("odd", "t1")))
    assert allowed is not None and 0 < allowed.sum() < n // 10
    query = vectors[11]
    found = index._dense(query, allowed)
    assert found and all(allowed[d] for d, _ in found)
    members = np.flatnonzero(allowed)
    exact = members[np.argsort(-(vectors[members] @ query))][: len(found)]
    overlap = len({d for d, _ in found} & set(exact.tolist())) / len(found)
    assert overlap >= 0.9


def test_an_add_whose_analysis_fails_leaves_the_index_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The text key, tags and metadata were recorded before the text was analysed: a record
    whose analysis raised (the stemmer's recursion) left its tag and text key behind, so the
    next record matched the failed one's tag filter (found in review). Now nothing of it
    stays, and the next record is numbered and filtered as if it had never been tried."""
    index = FleetIndex(0, ContextSettings())
    index.add("a", "run", "the first note about lunch", b"ka", facts=DocFacts(agent_id="x"))
    counts = fleet_index._term_counts

    def failing(tokens: list[str]) -> dict[str, float]:
        if "zqpoison" in tokens:
            raise RecursionError("analysis failed")
        return counts(tokens)

    monkeypatch.setattr(fleet_index, "_term_counts", failing)
    with pytest.raises(RecursionError):
        index.add("b", "run", "zqpoison zebra", b"kb",
                  facts=DocFacts(agent_id="x", tags=("secret",), metadata={"level": "top"}))
    assert "b" not in index.doc_of and b"kb" not in index.text_keys
    index.add("c", "run", "a later note", b"kc", facts=DocFacts(agent_id="x"))
    assert index.doc_of == {"a": 0, "c": 1}
    assert index.mask(DocFilter(tags_all=("secret",))) is not None
    assert not index.mask(DocFilter(tags_all=("secret",))).any()  # type: ignore[union-attr]
    assert not index.mask(DocFilter(metadata=(("level", "top"),))).any()  # type: ignore[union-attr]
