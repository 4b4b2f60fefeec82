"""Domains (the seed's shards) and routing by keyword score (seed 001).

A write without a domain goes to the domain with the highest
``keyword matches + 2 x importance``; ties go to the earlier domain in the
default order. A domain's importance reflects how much it is used: each use
adds 1 to a usage score that decays with a half-life of
:data:`USAGE_HALF_LIFE_S`, and importance is that score relative to the
fleet's busiest domain (0..1).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from services.common.errors import InvalidArgument

USAGE_HALF_LIFE_S = 7 * 24 * 3600.0
MAX_KEYWORDS = 64
MAX_DISPLAY_NAME = 128
"""Characters of a domain's display name (the column holds 128)."""
MAX_DESCRIPTION = 4096
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Domain:
    name: str
    display_name: str
    description: str
    keywords: tuple[str, ...]
    usage_score: float = 0.0
    usage_ts: float = 0.0
    record_count: int = 0
    updated_ts: float = 0.0
    importance: float = 0.0

    def decayed_usage(self, now: float) -> float:
        if self.usage_score <= 0.0:
            return 0.0
        return self.usage_score * math.exp2(-max(0.0, now - self.usage_ts) / USAGE_HALF_LIFE_S)

    def used(self, times: int, now: float) -> Domain:
        return replace(
            self,
            usage_score=self.decayed_usage(now) + times,
            usage_ts=now,
            record_count=self.record_count + times,
            updated_ts=now,
        )


DEFAULT_DOMAINS: tuple[Domain, ...] = (
    Domain(
        "projects",
        "Projects",
        "Project tracking, tasks, objectives",
        ("project", "task", "goal", "objective"),
    ),
    Domain(
        "insights",
        "Insights",
        "Lessons learned, patterns, decisions",
        ("lesson", "pattern", "insight", "decision", "learned"),
    ),
    Domain(
        "people",
        "People",
        "Contacts, experts, relationships",
        ("@", "contact", "person", "expert", "builder"),
    ),
    Domain(
        "technical",
        "Technical",
        "Architecture, code, protocols, frameworks",
        ("architecture", "framework", "code", "protocol", "shard", "layer", "pillar"),
    ),
    Domain(
        "strategy",
        "Strategy",
        "Long-term vision, priorities, strategies",
        ("strategy", "vision", "priority", "trend", "strategic"),
    ),
)
DEFAULT_ORDER = {d.name: i for i, d in enumerate(DEFAULT_DOMAINS)}


def validate_domain_name(name: str) -> str:
    name = name.strip().lower()
    if name.startswith("shard_"):
        name = name[len("shard_") :]
    if not _NAME.match(name):
        raise InvalidArgument(
            f"domain name {name!r} must be lowercase letters, digits, - or _, "
            "starting with a letter, at most 64 characters",
            reason="INVALID_DOMAIN_NAME",
        )
    return name


def validate_keywords(keywords: Sequence[str]) -> tuple[str, ...]:
    cleaned = tuple(dict.fromkeys(k.strip().lower() for k in keywords if k.strip()))
    if len(cleaned) > MAX_KEYWORDS or any(len(k) > 64 for k in cleaned):
        raise InvalidArgument(
            f"at most {MAX_KEYWORDS} keywords of at most 64 characters", reason="INVALID_KEYWORDS"
        )
    return cleaned


def validate_domain_text(display_name: str, description: str) -> None:
    """A domain's display name and description within their limits, checked before the store
    is (Postgres refuses a display name past its column; SQLite would keep it). NUL in any text
    field is refused for every RPC by the interceptors (``refuse_nul``)."""
    for field, value, most in (("display_name", display_name, MAX_DISPLAY_NAME),
                               ("description", description, MAX_DESCRIPTION)):
        if len(value) > most:
            raise InvalidArgument(f"{field} holds {len(value)} characters; at most {most}",
                                  reason="LIMIT_EXCEEDED", metadata={"field": field,
                                                                     "limit": str(most)})


def with_importance(domains: Sequence[Domain], now: float) -> list[Domain]:
    busiest = max((d.decayed_usage(now) for d in domains), default=0.0)
    return [
        replace(d, importance=(d.decayed_usage(now) / busiest) if busiest > 0 else 0.0)
        for d in domains
    ]


@functools.lru_cache(maxsize=256)
def _keyword_index(
    keyword_sets: tuple[tuple[str, ...], ...],
) -> tuple[re.Pattern[str] | None, dict[str, tuple[int, ...]], tuple[tuple[int, str], ...]]:
    """One regex over every word keyword (longest first) and the sets that list each one."""
    owners: dict[str, list[int]] = {}
    symbols: list[tuple[int, str]] = []
    for position, keywords in enumerate(keyword_sets):
        for keyword in keywords:
            if keyword.isalnum():
                owners.setdefault(keyword, []).append(position)
            else:
                symbols.append((position, keyword))
    alternatives = sorted(owners, key=len, reverse=True)
    pattern = (
        re.compile(r"\b(" + "|".join(map(re.escape, alternatives)) + r")\w*")
        if alternatives
        else None
    )
    return pattern, {k: tuple(v) for k, v in owners.items()}, tuple(symbols)


def keyword_counts(content: str, keyword_sets: Sequence[Sequence[str]]) -> list[int]:
    """Per keyword set: words of ``content`` that start with one of its keywords ("lesson"
    matches "lessons"; the longest matching keyword decides), plus symbol occurrences ("@")."""
    pattern, owners, symbols = _keyword_index(tuple(tuple(k) for k in keyword_sets))
    counts = [0] * len(keyword_sets)
    text = content.lower()
    if pattern is not None:
        for keyword in pattern.findall(text):
            for position in owners[keyword]:
                counts[position] += 1
    for position, symbol in symbols:
        counts[position] += text.count(symbol)
    return counts


def keyword_matches(content: str, keywords: Sequence[str]) -> int:
    return keyword_counts(content, [keywords])[0]


def route(content: str, domains: Sequence[Domain]) -> str:
    """The seed's score: keyword matches + 2 x the domain's importance."""
    if not domains:
        raise InvalidArgument("this fleet has no domains to route into", reason="NO_DOMAINS")
    counts = keyword_counts(content, [d.keywords for d in domains])

    def score(position: int) -> tuple[float, int]:
        domain = domains[position]
        value = counts[position] + 2.0 * domain.importance
        return (value, -DEFAULT_ORDER.get(domain.name, len(DEFAULT_ORDER)))

    return domains[max(range(len(domains)), key=score)].name
