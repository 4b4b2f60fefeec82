from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from services.shard.retrieval.fusion import convex_fusion, reciprocal_rank_fusion, top_k
from services.shard.retrieval.lexical import BM25Index
from services.shard.retrieval.text import DateMention, analyze, date_mentions, stem, tokenize


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("caresses", "caress"),
        ("ponies", "poni"),
        ("motoring", "motor"),
        ("hopping", "hop"),
        ("relational", "relat"),
        ("generalizations", "gener"),
        ("painting", "paint"),
        ("painted", "paint"),
        ("happy", "happi"),
        ("adjustment", "adjust"),
        ("controll", "control"),
    ],
)
def test_porter_stemmer_matches_reference_examples(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_analyze_drops_stop_words_and_contraction_tails() -> None:
    assert tokenize("Caroline's dog") == ["caroline", "dog"]
    assert analyze("I went to the LGBTQ support groups") == ["went", "lgbtq", "support", "group"]
    assert analyze("The paintings", stemming=False) == ["paintings"]


def test_bm25_prefers_rare_terms_and_shorter_documents() -> None:
    index = BM25Index()
    docs = [
        ["cat", "sat", "mat"],
        ["dog", "sat", "log"],
        ["cat", "cat", "dog", "sat", "long", "text", "here"],
    ]
    for doc in docs:
        index.add(doc)
    scores = index.scores(["cat"])
    assert scores[1] == 0.0
    assert scores[0] > 0.0 and scores[2] > 0.0
    assert index.idf("mat") > index.idf("sat")
    assert top_k(index.scores(["mat", "sat"]), 1) == [0]


def test_bm25_weighted_terms_count_fractionally() -> None:
    index = BM25Index()
    full = index.add(Counter({"river": 1.0}))
    faint = index.add(Counter({"river": 0.2, "bank": 0.8}))
    scores = index.scores(["river"])
    assert scores[full] > scores[faint] > 0.0


def test_rrf_rewards_agreement_between_lists() -> None:
    fused = reciprocal_rank_fusion([[1, 2, 3], [2, 1, 4]], k=60)
    assert fused[1] == fused[2] > fused[3] > 0
    assert max(fused, key=lambda d: fused[d]) in (1, 2)
    assert 4 in fused


def test_convex_fusion_normalises_each_list() -> None:
    a = np.array([10.0, 0.0, 5.0], dtype=np.float32)
    b = np.array([0.0, 0.2, 0.1], dtype=np.float32)
    fused = convex_fusion([(0.5, a), (0.5, b)])
    assert list(np.round(fused, 3)) == [0.5, 0.5, 0.5]
    assert top_k(convex_fusion([(0.8, a), (0.2, b)]), 1) == [0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What did she paint on October 13, 2023?", [DateMention(2023, 10, 13)]),
        ("1:56 pm on 8 May, 2023", [DateMention(2023, 5, 8)]),
        ("camping in June", [DateMention(None, 6, None)]),
        ("trips in 2023", [DateMention(2023, None, None)]),
        ("logged 2023-05-08T10:00", [DateMention(2023, 5, 8)]),
        ("Jan 5, 2024", [DateMention(2024, 1, 5)]),
        ("I may go; Jan and Mark came; maybe", []),  # the verb and names are no months
    ],
)
def test_date_mentions_are_as_precise_as_the_text(text: str, expected: list[DateMention]) -> None:
    assert date_mentions(text) == expected
