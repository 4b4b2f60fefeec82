"""The state the witness chain implies, compared with the state the store holds.

Replaying the chain gives, for every agent, rule and decision, the entry that
last wrote it and a digest of what it wrote; a stored row that disagrees was
changed outside governance.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from services.common.canonical import canonical_bytes
from services.governance.domain.decisions import IMPORTED_DECISION, Decision
from services.governance.domain.erasures import IMPORTED_ERASURE, RECORDED_ERASURE
from services.governance.domain.rules import Rule
from services.governance.domain.tiers import AgentTrust
from services.governance.domain.witness import ChainEntry

Written = tuple[int, str]
"""``(chain_seq, digest)``: the entry that wrote a state and a digest of that state."""


def state_digest(state: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_bytes(state)).hexdigest()


class ChainReplay:
    """Each state's expected ``(chain_seq, digest)``, gathered while the chain is walked."""

    def __init__(self) -> None:
        self.agents: dict[tuple[str, str], Written] = {}
        self.rules: dict[str, Written] = {}
        self.decisions: dict[str, Written] = {}
        self.revocations: dict[str, Written] = {}
        self.erasures: dict[str, Written] = {}
        self.unreadable: list[str] = []

    def feed(self, entries: Iterable[ChainEntry]) -> Iterator[ChainEntry]:
        for entry in entries:
            try:
                self._gather(entry)
            except (ValueError, KeyError, TypeError, AttributeError) as error:  # edited payload
                self.unreadable.append(f"entry {entry.seq} ({entry.kind}): its payload does "
                                       f"not read as a chain entry ({type(error).__name__})")
            yield entry

    def _gather(self, entry: ChainEntry) -> None:
        payload = entry.payload
        agent = payload.get("agent")
        if isinstance(agent, dict):
            key = (agent["fleet_id"], agent["agent_id"])
            self.agents[key] = (entry.seq, state_digest(agent))
        if entry.kind in ("gate.decision", IMPORTED_DECISION):
            decision = payload["decision"]
            self.decisions[decision["decision_id"]] = (entry.seq, state_digest(decision))
        elif entry.kind == "rule.created":
            self.rules[payload["rule"]["rule_id"]] = (entry.seq,
                                                      state_digest(payload["rule"]))
        elif entry.kind == "rule.deleted":
            self.rules.pop(payload["rule_id"], None)
        elif entry.kind == "token.revoked":
            revoked = payload["revocation"]
            self.revocations[f"token {revoked['fleet_id']}/{revoked['jti']}"] = (
                entry.seq, state_digest(revoked))
        elif entry.kind in (RECORDED_ERASURE, IMPORTED_ERASURE):
            erasure = payload["erasure"]
            self.erasures[erasure["erasure_id"]] = (entry.seq, state_digest(erasure))
        elif entry.kind == "agent.tokens_revoked":
            revoked = payload["revocation"]
            revoked_key = f"agent {revoked['fleet_id']}/{revoked['agent_id']}"
            self.revocations[revoked_key] = (entry.seq, state_digest(revoked))

    def differences(self, agents: Iterable[tuple[AgentTrust, int]],
                    rules: Iterable[tuple[Rule, int]],
                    decisions: Iterable[Decision]) -> list[str]:
        """Every stored state (with the seq of the entry that wrote it) the chain disagrees with."""
        seen_agents = {(a.fleet_id, a.agent_id): (seq, state_digest(a.state()))
                       for a, seq in agents}
        problems = [*self.unreadable, *_differences("agent", self.agents, seen_agents)]
        seen_rules = {r.rule_id: (seq, state_digest(r.state())) for r, seq in rules}
        problems += _differences("rule", self.rules, seen_rules)
        seen_decisions = {d.decision_id: (d.chain_seq, state_digest(d.state()))
                          for d in decisions}
        problems += _differences("decision", self.decisions, seen_decisions)
        return problems


def revocation_differences(replay: ChainReplay,
                           stored: Iterable[tuple[str, dict[str, Any], int]]) -> list[str]:
    """Every stored revocation ``(key, state, chain_seq)`` the chain disagrees with."""
    seen = {key: (seq, state_digest(state)) for key, state, seq in stored}
    return _differences("revocation", replay.revocations, seen)


def erasure_differences(replay: ChainReplay,
                        stored: Iterable[tuple[str, dict[str, Any], int]]) -> list[str]:
    """Every stored erasure ``(erasure_id, state, chain_seq)`` the chain disagrees with."""
    seen = {key: (seq, state_digest(state)) for key, state, seq in stored}
    return _differences("erasure", replay.erasures, seen)


def _differences(kind: str, expected: dict[Any, Written],
                 stored: dict[Any, Written]) -> list[str]:
    problems = []
    for key in sorted(set(expected) | set(stored), key=str):
        want, have = expected.get(key), stored.get(key)
        if have is None:
            problems.append(f"{kind} {key} is in the chain but missing from the store")
        elif want is None:
            problems.append(f"{kind} {key} is in the store but no chain entry wrote it")
        elif want != have:
            problems.append(f"{kind} {key} differs from chain entry {want[0]} "
                            "(the row was changed outside governance)")
    return problems
