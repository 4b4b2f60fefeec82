"""What the gate last read or committed, reused while the database says nothing changed.

Governance is the only writer of its store and every change appends to the
witness chain, so the chain head ``(length, link)``, read under the append lock
at the start of each gate transaction, versions the whole store: when it equals
the head this process last saw, cached agent trust is exact; when another
replica (or anything else) appended since, the agents are dropped. Rules carry
their own counter (``rules_version`` on the head row, raised by every rule
change), so replicas interleaving decisions keep their rule caches. New trust
states are published only after their transaction commits.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.governance.domain.rules import Rule
from services.governance.domain.tiers import AgentTrust
from services.governance.domain.witness import HeadState

AgentKey = tuple[str, str]
MAX_AGENTS = 100_000


class GateCache:
    """Rules per fleet and trust per agent; callers hold the append lock."""

    def __init__(self) -> None:
        self._head: tuple[int, str] | None = None
        self._rules_version: int | None = None
        self._rules: dict[str, tuple[Rule, ...]] = {}
        # None: the agent has no row yet (the gate inserts one rather than updating).
        self._agents: dict[AgentKey, AgentTrust | None] = {}

    def align(self, head: HeadState) -> None:
        """Drop whatever another writer may have changed since this process last looked."""
        if (head.length, head.link) != self._head or len(self._agents) > MAX_AGENTS:
            self._agents.clear()
        if head.rules_version != self._rules_version:
            self._rules.clear()
        self._head, self._rules_version = (head.length, head.link), head.rules_version

    def rules(self, fleet_id: str) -> tuple[Rule, ...] | None:
        return self._rules.get(fleet_id)

    def remember_rules(self, fleet_id: str, rules: tuple[Rule, ...]) -> None:
        self._rules[fleet_id] = rules

    def agent(self, key: AgentKey) -> tuple[bool, AgentTrust | None]:
        """``(known, trust)``; known with ``None`` means the agent has no row yet."""
        if key in self._agents:
            return True, self._agents[key]
        return False, None

    def remember_agent(self, key: AgentKey, trust: AgentTrust | None) -> None:
        self._agents[key] = trust

    def committed(self, head: HeadState, agents: Mapping[AgentKey, AgentTrust]) -> None:
        """The transaction that moved the chain to ``head`` and wrote ``agents`` committed."""
        self._agents.update(agents)
        self._head, self._rules_version = (head.length, head.link), head.rules_version

    def forget(self) -> None:
        self._head, self._rules_version = None, None
        self._rules.clear()
        self._agents.clear()
