"""Fusing ranked lists: reciprocal rank fusion and normalised score fusion."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Scores = npt.NDArray[np.float32]


def top_k(scores: Scores, k: int) -> list[int]:
    """Indices of the k highest scores, best first (ties by lower index)."""
    k = min(k, len(scores))
    if k <= 0:
        return []
    part = np.argpartition(-scores, k - 1)[:k]
    return [int(i) for i in sorted(part, key=lambda i: (-scores[i], i))]


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]], *, k: float = 60.0, weights: Sequence[float] | None = None
) -> dict[int, float]:
    """RRF (Cormack et al. 2009): sum of weight / (k + rank) over the lists a doc appears in."""
    fused: dict[int, float] = {}
    for i, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[i]
        for rank, doc in enumerate(ranking, start=1):
            fused[doc] = fused.get(doc, 0.0) + weight / (k + rank)
    return fused


def min_max(scores: Scores) -> Scores:
    low, high = float(scores.min(initial=0.0)), float(scores.max(initial=0.0))
    if high - low <= 1e-12:
        return np.zeros_like(scores)
    return ((scores - low) / (high - low)).astype(np.float32, copy=False)


def convex_fusion(parts: Sequence[tuple[float, Scores]]) -> Scores:
    """Weighted sum of min-max normalised score arrays of equal length (Bruch et al. 2023)."""
    total = np.zeros_like(parts[0][1])
    for weight, scores in parts:
        total += weight * min_max(scores)
    return total
