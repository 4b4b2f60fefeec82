"""Judging whether a candidate contradicts an existing record, from text alone.

The shard sends the candidate's nearest records; governance never reads the
shard store. Two statements contradict when they say nearly the same thing
(token overlap after dropping negations) but with opposite polarity ("X is
enabled" / "X is not enabled", or an antonym swap such as true/false), or
with different numbers ("the port is 8080" / "the port is 9090"). This is a
deliberately conservative lexical judge: it denies clear reversals and lets
paraphrases through.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_MIN_OVERLAP = 0.6

_NEGATIONS = frozenset({
    "not", "no", "never", "none", "nothing", "neither", "nor", "cannot", "without",
    "isn't", "aren't", "wasn't", "weren't", "don't", "doesn't", "didn't", "won't",
    "can't", "shouldn't", "mustn't", "hasn't", "haven't", "n't",
})
_ANTONYMS = {
    "true": "false", "enabled": "disabled", "enable": "disable", "allowed": "forbidden",
    "allow": "deny", "safe": "unsafe", "valid": "invalid", "correct": "incorrect",
    "success": "failure", "succeeded": "failed", "always": "never", "increase": "decrease",
    "increased": "decreased", "open": "closed", "on": "off", "yes": "no", "approved": "rejected",
    "required": "optional", "public": "private", "active": "inactive",
}
_ANTONYM_OF = {**_ANTONYMS, **{b: a for a, b in _ANTONYMS.items()}}
_STOPWORDS = frozenset({"the", "a", "an", "is", "are", "was", "were", "be", "to", "of", "and",
                        "it", "that", "this", "in", "for", "we", "our", "should", "do", "does"})
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?(?:\.[0-9]+)?")


@dataclass(frozen=True)
class _Statement:
    words: frozenset[str]
    numbers: frozenset[str]
    negated: bool


def _parse(text: str) -> _Statement:
    tokens = _TOKEN.findall(text.lower())
    negations = sum(1 for t in tokens if t in _NEGATIONS or t.endswith("n't"))
    words: set[str] = set()
    numbers: set[str] = set()
    flips = 0
    for token in tokens:
        if token in _NEGATIONS or token.endswith("n't") or token in _STOPWORDS:
            continue
        if token[0].isdigit():
            numbers.add(token)
            continue
        if token in _ANTONYMS.values():
            flips += 1
            token = _ANTONYM_OF[token]
        words.add(_stem(token))
    return _Statement(frozenset(words), frozenset(numbers), (negations + flips) % 2 == 1)


def _stem(word: str) -> str:
    # Plural and third-person "s" only: enough for "require"/"requires".
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _overlap(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def contradicts(candidate: str, existing: str, min_overlap: float = DEFAULT_MIN_OVERLAP) -> bool:
    """True when ``candidate`` reverses or changes the number in ``existing``."""
    new, old = _parse(candidate), _parse(existing)
    if _overlap(new.words, old.words) < min_overlap:
        return False
    if new.negated != old.negated:
        return True
    return bool(new.numbers and old.numbers and new.numbers != old.numbers)


def first_contradiction(candidate: str, neighbours: Iterable[tuple[str, str]],
                        min_overlap: float = DEFAULT_MIN_OVERLAP) -> str | None:
    """The id of the first neighbour (id, content) the candidate contradicts."""
    for record_id, content in neighbours:
        if contradicts(candidate, content, min_overlap):
            return record_id
    return None
