from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from services.shard.retrieval.lexical import BM25Index
from services.shard.retrieval.text import (
    DateMention,
    analyze,
    date_mentions,
    query_terms,
    stem,
    tokenize,
)


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
    assert int(np.argmax(index.scores(["mat", "sat"]))) == 0


def test_bm25_weighted_terms_count_fractionally() -> None:
    index = BM25Index()
    full = index.add(Counter({"river": 1.0}))
    faint = index.add(Counter({"river": 0.2, "bank": 0.8}))
    scores = index.scores(["river"])
    assert scores[full] > scores[faint] > 0.0


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


def test_words_of_any_script_are_terms_on_both_lexical_paths() -> None:
    terms = query_terms("Caroline's café in 東京")
    assert "café" in terms and "東京" in terms
    assert "s" not in terms


def test_a_long_word_is_stemmed_without_being_kept() -> None:
    """A search's words are its caller's: one unique 8 KB word a query kept 16 KB in the stem
    cache for good, about 3 GB once full (found in review, 2026-11-30)."""
    from services.shard.retrieval import text

    before = text._cached_stem.cache_info().currsize
    for n in range(50):
        long_word = f"{n:04d}" + "x" * 8000 + "ings"
        assert text.stem(long_word) == text._stem(long_word)
    assert text._cached_stem.cache_info().currsize == before
    assert text.stem("running") == "run"  # a short word: cached as before
    assert text._cached_stem.cache_info().currsize <= before + 1
