from __future__ import annotations

from pathlib import Path

import pytest

from engram.eval.locomo import (
    RecallReport,
    evidence_recall,
    load_conversation,
    normalise_evidence,
    parse_session_date,
    percentile,
)
from services.shard.retrieval.embedding import HashEmbedder
from services.shard.search.fleet_index import ContextSettings, FleetIndex

EXCERPT = Path(__file__).resolve().parents[2] / "data" / "locomo" / "30_sessions_1_2.json"


def test_loads_turns_dates_and_questions_with_evidence() -> None:
    conv = load_conversation(EXCERPT)
    assert conv.speakers == ("Jon", "Gina")
    assert len(conv.turns) == 44
    assert conv.turns[0].dia_id == "D1:1" and conv.turns[0].session == 1
    assert parse_session_date(conv.turns[0].session_date) is not None
    assert len(conv.questions) == 22
    known = {t.dia_id for t in conv.turns}
    assert all(set(q.evidence) <= known for q in conv.questions)
    assert conv.turns[0].memory_text().startswith("Gina: Hey Jon")


def test_evidence_ids_as_released_are_normalised() -> None:
    assert normalise_evidence(["D8:6; D9:17", "D:11:26", "D", "D8:6"]) == [
        "D8:6",
        "D9:17",
        "D11:26",
    ]


def test_recall_counts_share_of_evidence_in_top_k() -> None:
    assert evidence_recall(["a", "b", "c"], ["b", "z"], 2) == 0.5
    assert evidence_recall(["a", "b", "c"], ["c"], 2) == 0.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([], 95) == 0.0


def test_lexical_ranking_on_excerpt_finds_most_evidence() -> None:
    conv = load_conversation(EXCERPT)
    index = FleetIndex(0, ContextSettings())
    for turn in conv.turns:
        index.add(turn.dia_id, f"session-{turn.session}", turn.memory_text())
    report = RecallReport(ks=(5, 10))
    for q in conv.questions:
        report.add(q, [index.ids[d] for d, _ in index.search(q.text, None, "lexical")[:10]], 1.0)
    result = report.as_dict()
    assert result["queries"] == 22
    assert report.recall(10) >= report.recall(5) >= 0.5
    categories = result["categories"]
    assert isinstance(categories, dict) and "single-hop" in categories


@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_semantic_and_hybrid_modes_rank_with_an_embedder(mode: str) -> None:
    rows = [
        ("a", "s1", "Jon: I lost my banking job and I'm opening a dance studio"),
        ("b", "s1", "Gina: my clothing store launched online"),
        ("c", "s2", "Jon: the weather was rainy all week"),
    ]
    embedder = HashEmbedder(64)
    index = FleetIndex(embedder.dimension, ContextSettings())
    docs = [index.add(rid, run, text) for rid, run, text in rows]
    index.add_vectors(docs, embedder.embed([text for _, _, text in rows]))
    found = index.search("dance studio", embedder.embed(["dance studio"])[0], mode)
    assert index.ids[found[0][0]] == "a"
