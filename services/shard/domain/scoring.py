"""Ranking factors applied after relevance (seed 001 "dynamic scoring", seed 002 R2).

final = relevance x importance_factor x recency x trust, where
- importance_factor = 0.5 + importance            (0.5 .. 1.5)
- recency = 0.5 + 0.5 x 2^(-age / RECENCY_HALF_LIFE_S)   (1.0 when new, -> 0.5 when old)
- trust is the author's multiplier from governance (suspended = 0.0: never shown).
Old memories lose at most half their weight: age alone never hides a memory.
"""

from __future__ import annotations

import math

RECENCY_HALF_LIFE_S = 90 * 24 * 3600.0


def importance_factor(importance: float) -> float:
    return 0.5 + importance


def recency(age_s: float) -> float:
    return 0.5 + 0.5 * math.exp2(-max(0.0, age_s) / RECENCY_HALF_LIFE_S)


def final_score(relevance: float, importance: float, age_s: float, trust: float) -> float:
    return relevance * importance_factor(importance) * recency(age_s) * trust
