"""Text analysis for lexical ranking: tokenise, drop stop words, Porter-stem.

One tokenizer and one stop-word list serve every lexical path: the in-memory
BM25 index analyses text with them, and the store's full-text search (the
gate's neighbours, cross-reference expansion) takes its query terms from
:func:`query_terms`. The stemmer is M. F. Porter's 1980 algorithm ("An
algorithm for suffix stripping"), written out here so lexical ranking needs no
extra dependency.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

# Letters and digits of any script, so the full-text path keeps "café" and CJK words whole.
_TOKEN = re.compile(r"[^\W_]+")
_APOSTROPHE = re.compile(r"['\u2019](s|d|ll|re|ve|m|t)\b")

# Common English function words plus chat filler ("yeah", "wow") that carries no topic.
_STOP_WORD_TEXT = """
    a about above after again against all am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn
    doing don down during each few for from further had hadn has hasn have haven having he
    her here hers herself him himself his how i if in into is isn it its itself just let ll
    me more most much must my myself no nor not now of off on once only or other ought our
    ours ourselves out over own re same shan she should shouldn so some such than that the
    their theirs them themselves then there these they this those through to too under until
    up us very was wasn we were weren what when where which while who whom why will with won
    would wouldn you your yours yourself yourselves s t d m ve also oh yeah hey wow really
    thanks thank like just get got go going gonna know think so
"""
STOP_WORDS = frozenset(_STOP_WORD_TEXT.split())
MAX_QUERY_TERMS = 32


def _vowels(word: str) -> Iterator[bool]:
    """Whether each letter is a vowel in Porter's sense: a, e, i, o, u, and a y that follows
    a consonant. One pass, left to right: the recursive form (a y asks its left neighbour)
    went one call deep per letter, so a word of ~1,000 y's raised RecursionError in the
    index and a later, innocent write failed INTERNAL."""
    previous_vowel = True  # a y at the start is a consonant
    for ch in word:
        vowel = ch in "aeiou" or (ch == "y" and not previous_vowel)
        yield vowel
        previous_vowel = vowel


def _is_consonant(word: str, i: int) -> bool:
    *_, vowel = _vowels(word[: i + 1])
    return not vowel


def _measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in ``stem``."""
    m, previous_vowel = 0, False
    for vowel in _vowels(stem):
        if previous_vowel and not vowel:
            m += 1
        previous_vowel = vowel
    return m


def _has_vowel(stem: str) -> bool:
    return any(_vowels(stem))


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _is_consonant(word, len(word) - 1)


def _cvc(word: str) -> bool:
    if len(word) < 3:
        return False
    return (
        _is_consonant(word, len(word) - 3)
        and not _is_consonant(word, len(word) - 2)
        and _is_consonant(word, len(word) - 1)
        and word[-1] not in "wxy"
    )


def _replace(word: str, rules: tuple[tuple[str, str], ...], min_measure: int) -> str:
    for suffix, replacement in rules:
        if word.endswith(suffix):
            stem = word[: len(word) - len(suffix)]
            return stem + replacement if _measure(stem) > min_measure else word
    return word


_STEP2 = (
    ("ational", "ate"),
    ("tional", "tion"),
    ("enci", "ence"),
    ("anci", "ance"),
    ("izer", "ize"),
    ("abli", "able"),
    ("alli", "al"),
    ("entli", "ent"),
    ("eli", "e"),
    ("ousli", "ous"),
    ("ization", "ize"),
    ("ation", "ate"),
    ("ator", "ate"),
    ("alism", "al"),
    ("iveness", "ive"),
    ("fulness", "ful"),
    ("ousness", "ous"),
    ("aliti", "al"),
    ("iviti", "ive"),
    ("biliti", "ble"),
)
_STEP3 = (
    ("icate", "ic"),
    ("ative", ""),
    ("alize", "al"),
    ("iciti", "ic"),
    ("ical", "ic"),
    ("ful", ""),
    ("ness", ""),
)
_STEP4 = (
    "al",
    "ance",
    "ence",
    "er",
    "ic",
    "able",
    "ible",
    "ant",
    "ement",
    "ment",
    "ent",
    "ion",
    "ou",
    "ism",
    "ate",
    "iti",
    "ous",
    "ive",
    "ize",
)


MAX_CACHED_WORD = 64
"""Longer words are stemmed each time, not cached: a search's words are a caller's, and one
unique 8 KB word a query kept 16 KB in the cache for good (about 3 GB full; found in review,
2026-11-30)."""


def stem(word: str) -> str:
    """Porter stem of a lower-case word."""
    return _cached_stem(word) if len(word) <= MAX_CACHED_WORD else _stem(word)


@lru_cache(maxsize=200_000)
def _cached_stem(word: str) -> str:
    return _stem(word)


def _stem(word: str) -> str:
    if len(word) <= 2:
        return word
    # Step 1a
    if word.endswith("sses") or word.endswith("ies"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    # Step 1b
    extra = False
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    elif word.endswith("ed") and _has_vowel(word[:-2]):
        word, extra = word[:-2], True
    elif word.endswith("ing") and _has_vowel(word[:-3]):
        word, extra = word[:-3], True
    if extra:
        if word.endswith(("at", "bl", "iz")):
            word += "e"
        elif _double_consonant(word) and word[-1] not in "lsz":
            word = word[:-1]
        elif _measure(word) == 1 and _cvc(word):
            word += "e"
    # Step 1c
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    word = _replace(word, _STEP2, 0)
    word = _replace(word, _STEP3, 0)
    # Step 4
    for suffix in sorted(_STEP4, key=len, reverse=True):
        if word.endswith(suffix):
            stem_part = word[: len(word) - len(suffix)]
            if _measure(stem_part) > 1 and (suffix != "ion" or stem_part.endswith(("s", "t"))):
                word = stem_part
            break
    # Step 5
    if word.endswith("e"):
        stem_part = word[:-1]
        m = _measure(stem_part)
        if m > 1 or (m == 1 and not _cvc(stem_part)):
            word = stem_part
    if _measure(word) > 1 and _double_consonant(word) and word.endswith("l"):
        word = word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens, contractions' tails dropped ("Caroline's" -> "caroline")."""
    return _TOKEN.findall(_APOSTROPHE.sub("", text.lower()))


def analyze(
    text: str, *, stop_words: frozenset[str] = STOP_WORDS, stemming: bool = True
) -> list[str]:
    """Index terms of ``text``: tokens minus stop words, stemmed."""
    return analyze_tokens(tokenize(text), stop_words=stop_words, stemming=stemming)


def analyze_tokens(
    tokens: list[str], *, stop_words: frozenset[str] = STOP_WORDS, stemming: bool = True
) -> list[str]:
    """:func:`analyze` of text already split by :func:`tokenize`."""
    terms = [t for t in tokens if t not in stop_words]
    return [stem(t) for t in terms] if stemming else terms


def query_terms(query: str, limit: int = MAX_QUERY_TERMS) -> list[str]:
    """A full-text query's words: distinct tokens minus stop words (all kept if nothing else
    is left), unstemmed, since the store's full-text index stems with its own analyser."""
    words = list(dict.fromkeys(tokenize(query)))
    kept = [w for w in words if w not in STOP_WORDS]
    return (kept or words)[:limit]


@dataclass(frozen=True)
class DateMention:
    """A calendar date named in text; a part left unnamed (None) matches any value."""

    year: int | None
    month: int | None
    day: int | None


_MONTH_NAMES = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, 1)}
_MONTHS.update({name[:3]: number for name, number in list(_MONTHS.items())})
_MONTHS["Sept"] = 9
# Month names only capitalised ("May", not the verb "may"), abbreviated only beside a day
# ("Jan" alone is a name): "8 May, 2023", "May 8th 2023", "May 2023", "May", "2023-05-08",
# or a year alone.
_MONTH = "(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_FULL_MONTH = "(" + "|".join(_MONTH_NAMES) + ")"
_DATE = re.compile(
    rf"\b(?:(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}|{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?\b"
    rf"|{_FULL_MONTH})(?:,?\s+((?:19|20)\d\d))?\b"
    r"|\b((?:19|20)\d\d)-(\d\d)-(\d\d)(?!\d)|\b((?:19|20)\d\d)\b"
)


def date_mentions(text: str) -> list[DateMention]:
    """Dates named in ``text``, as precise as the text is ("in June" names a month only)."""
    out: list[DateMention] = []
    for match in _DATE.finditer(text):
        day1, month1, month2, day2, month3, year, iso_y, iso_m, iso_d, bare_year = match.groups()
        if iso_y:
            out.append(DateMention(int(iso_y), int(iso_m), int(iso_d)))
        elif bare_year:
            out.append(DateMention(int(bare_year), None, None))
        else:
            day = day1 or day2
            out.append(
                DateMention(
                    int(year) if year else None,
                    _MONTHS[month1 or month2 or month3],
                    int(day) if day else None,
                )
            )
    return out
