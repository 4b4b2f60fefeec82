"""What the shard service needs from outside its own store, as small ports.

The governance adapter (``services.shard.governance_gate``) implements both
over gRPC; the shard process never touches governance storage (the trust
boundary is a process boundary, DESIGN.md section 1).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Neighbour:
    """An existing record close to a candidate, sent so governance can judge contradictions."""

    record_id: str
    content: str
    agent_id: str
    score: float


@dataclass(frozen=True)
class GateCandidate:
    record_id: str
    content_hash: str
    content: str
    run_id: str
    domain: str
    source: str
    importance: float
    tags: tuple[str, ...]
    neighbours: tuple[Neighbour, ...] = field(default_factory=tuple)
    metadata: tuple[tuple[str, str], ...] = ()
    """``(key, value)`` pairs: governance judges them like the content."""


@dataclass(frozen=True)
class GateDecision:
    allowed: bool
    decision_id: str
    rule_ids: tuple[str, ...] = ()
    reason: str = ""


NeighbourSearch = Callable[[GateCandidate], Sequence[Neighbour]]
"""The nearest existing records to a candidate (a full-text search: worth skipping)."""


class WriteGate(Protocol):
    def decide(
        self, fleet_id: str, agent_id: str, candidates: Sequence[GateCandidate], request_id: str,
        find_neighbours: NeighbourSearch,
    ) -> list[GateDecision]:
        """One decision per candidate, in order. Raises ``Unavailable`` when governance is down.

        ``candidates`` come without neighbours; the gate calls ``find_neighbours`` only
        when governance needs them (a contradiction rule applies to the writer). A retry
        with the same ``request_id`` and candidates returns the recorded decisions.
        """
        ...


class TrustSource(Protocol):
    def multipliers(self, fleet_id: str, agent_ids: Collection[str]) -> dict[str, float]:
        """Trust multiplier per agent (suspended = 0.0). While governance is unreachable, the
        last known multiplier of each agent however old; agents it never saw are left out."""
        ...
