"""Trust tiers and the accumulator that moves an agent's score with outcomes.

The score is kept in thousandths (0..1000) so the witness chain and the rows
compare exactly. An operator-set tier is pinned: outcomes still move the
score, but only an operator changes a pinned tier. Suspension is only ever an
operator action; the accumulator moves agents between trusted, standard and
probation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class TrustTier(StrEnum):
    TRUSTED = "trusted"
    STANDARD = "standard"
    PROBATION = "probation"
    SUSPENDED = "suspended"

    @property
    def multiplier(self) -> float:
        return _MULTIPLIERS[self]

    @classmethod
    def parse(cls, text: str) -> TrustTier:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValueError(
                f"unknown tier {text!r}; choose one of {', '.join(t.value for t in cls)}"
            ) from None


_MULTIPLIERS = {
    TrustTier.TRUSTED: 1.25,
    TrustTier.STANDARD: 1.0,
    TrustTier.PROBATION: 0.5,
    TrustTier.SUSPENDED: 0.0,
}

SCORE_MAX = 1000
INITIAL_SCORE = 500
ACCEPTED_DELTA = 5
DENIED_DELTA = -40
TRUSTED_FROM = 850
STANDARD_FROM = 400
# Where an operator's tier puts the score, so an unpinned agent would sit in that tier.
_TIER_ANCHOR = {
    TrustTier.TRUSTED: 900,
    TrustTier.STANDARD: 600,
    TrustTier.PROBATION: 250,
    TrustTier.SUSPENDED: 0,
}


def tier_for_score(score: int) -> TrustTier:
    if score >= TRUSTED_FROM:
        return TrustTier.TRUSTED
    if score >= STANDARD_FROM:
        return TrustTier.STANDARD
    return TrustTier.PROBATION


@dataclass(frozen=True)
class AgentTrust:
    fleet_id: str
    agent_id: str
    tier: TrustTier = TrustTier.STANDARD
    score: int = INITIAL_SCORE
    pinned: bool = False
    updated_ms: int = 0

    @property
    def multiplier(self) -> float:
        return self.tier.multiplier

    def state(self) -> dict[str, object]:
        """What the witness chain records about this agent after a change."""
        return {"fleet_id": self.fleet_id, "agent_id": self.agent_id, "tier": self.tier.value,
                "score": self.score, "pinned": self.pinned, "updated_ms": self.updated_ms}


class TrustAccumulator:
    """Pure score arithmetic: outcome in, new trust out."""

    def record_outcome(self, trust: AgentTrust, accepted: bool, now_ms: int) -> AgentTrust:
        delta = ACCEPTED_DELTA if accepted else DENIED_DELTA
        score = min(SCORE_MAX, max(0, trust.score + delta))
        tier = trust.tier if trust.pinned else tier_for_score(score)
        return replace(trust, score=score, tier=tier, updated_ms=now_ms)

    def operator_sets(self, trust: AgentTrust, tier: TrustTier, now_ms: int) -> AgentTrust:
        return replace(trust, tier=tier, score=_TIER_ANCHOR[tier], pinned=True, updated_ms=now_ms)
