"""The README's ranking: relevance x (0.5 + importance) x recency x trust, where a summary
ranks with the lowest trust of its sources (services/shard/domain/scoring.py, SearchEngine)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from services.shard.domain.compaction import SOURCE_AUTHORS_KEY
from services.shard.domain.records import Record
from services.shard.domain.scoring import RECENCY_HALF_LIFE_S, final_score, recency
from services.shard.search.engine import SearchEngine

NOW = 1_800_000_000.0
DAY = 24 * 3600.0


class _Trust:
    def __init__(self, by_agent: dict[str, float]) -> None:
        self.by_agent = by_agent

    def multipliers(self, fleet_id: str, agent_ids: set[str]) -> dict[str, float]:
        return {a: self.by_agent[a] for a in agent_ids if a in self.by_agent}


def _record(record_id: str, agent: str, *, age_s: float = 0.0, importance: float = 0.5,
            sources: list[str] | None = None) -> Record:
    metadata = {SOURCE_AUTHORS_KEY: json.dumps(sources)} if sources is not None else {}
    return Record(id=record_id, fleet_id="f", run_id="", agent_id=agent, content="c",
                  content_hash="", record_hash="", domain="", source="", importance=importance,
                  tags=(), metadata=metadata, cross_refs=(),
                  created_us=int((NOW - age_s) * 1_000_000))


def _ranked(trust: dict[str, float], *records: Record) -> list[tuple[str, float]]:
    engine = SearchEngine(cast(Any, None), cast(Any, None), trust=_Trust(trust),
                          clock=lambda: NOW)
    hits = engine._rank("f", [(r, 1.0) for r in records], "direct")
    return [(hit.record.id, hit.score) for hit in hits]


def test_the_formula() -> None:
    assert recency(0) == 1.0
    assert recency(RECENCY_HALF_LIFE_S) == pytest.approx(0.75)
    assert recency(100 * RECENCY_HALF_LIFE_S) == pytest.approx(0.5)
    assert recency(-5) == 1.0  # a clock behind the record's time never raises it past new
    assert final_score(2.0, 0.5, RECENCY_HALF_LIFE_S, 0.5) == pytest.approx(2.0 * 1.0 * 0.75 * 0.5)


def test_a_newer_record_ranks_above_an_older_equal_one() -> None:
    ranked = _ranked({}, _record("old", "a", age_s=90 * DAY), _record("new", "a"))
    assert [r for r, _ in ranked] == ["new", "old"]
    assert ranked[1][1] == pytest.approx(ranked[0][1] * 0.75)


def test_a_less_trusted_author_ranks_lower_and_a_suspended_one_not_at_all() -> None:
    ranked = _ranked({"doubted": 0.5, "gone": 0.0}, _record("d", "doubted"),
                     _record("t", "trusted"), _record("g", "gone"))
    assert [r for r, _ in ranked] == ["t", "d"]
    assert ranked[1][1] == pytest.approx(ranked[0][1] * 0.5)


def test_a_summary_ranks_with_the_lowest_trust_of_its_sources() -> None:
    ranked = _ranked({"doubted": 0.25}, _record("s", "compactor", sources=["a", "doubted"]),
                     _record("plain", "a"))
    assert [r for r, _ in ranked] == ["plain", "s"]
    assert ranked[1][1] == pytest.approx(ranked[0][1] * 0.25)
    assert _ranked({"gone": 0.0}, _record("s", "compactor", sources=["a", "gone"])) == []
