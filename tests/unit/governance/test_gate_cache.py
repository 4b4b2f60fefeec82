"""GateCache: entries live only while the chain head and the rules version say they are current."""

from __future__ import annotations

from services.governance.domain.rules import Rule, RuleKind
from services.governance.domain.tiers import AgentTrust, TrustTier
from services.governance.domain.witness import HeadState
from services.governance.gate_cache import GateCache

RULE = Rule("r-1", "fleet-a", RuleKind.SIZE_LIMIT, {"max_bytes": 10})
AGENT = ("fleet-a", "agent-1")


def _warm(cache: GateCache, head: HeadState) -> None:
    cache.align(head)
    cache.remember_rules("fleet-a", (RULE,))
    cache.remember_agent(AGENT, AgentTrust(*AGENT, TrustTier.PROBATION, 300))


def test_entries_kept_while_the_head_is_the_one_this_process_saw() -> None:
    cache, head = GateCache(), HeadState(4, "ab" * 32, 1)
    _warm(cache, head)
    cache.align(head)
    assert cache.rules("fleet-a") == (RULE,)
    assert cache.agent(AGENT) == (True, AgentTrust(*AGENT, TrustTier.PROBATION, 300))


def test_another_writer_drops_agents_but_keeps_rules_of_the_same_version() -> None:
    cache = GateCache()
    _warm(cache, HeadState(4, "ab" * 32, 1))
    cache.align(HeadState(5, "cd" * 32, 1))
    assert cache.agent(AGENT) == (False, None)
    assert cache.rules("fleet-a") == (RULE,)


def test_a_rule_change_anywhere_drops_the_rules() -> None:
    cache = GateCache()
    _warm(cache, HeadState(4, "ab" * 32, 1))
    cache.align(HeadState(5, "cd" * 32, 2))
    assert cache.rules("fleet-a") is None


def test_committed_publishes_new_trust_and_head() -> None:
    cache = GateCache()
    _warm(cache, HeadState(4, "ab" * 32, 1))
    after = AgentTrust(*AGENT, TrustTier.PROBATION, 305, updated_ms=9)
    cache.committed(HeadState(6, "ef" * 32, 1), {AGENT: after})
    cache.align(HeadState(6, "ef" * 32, 1))
    assert cache.agent(AGENT) == (True, after)
    assert cache.rules("fleet-a") == (RULE,)


def test_an_agent_without_a_row_is_remembered_as_such_and_forget_clears_all() -> None:
    cache = GateCache()
    cache.align(HeadState(0, "00" * 32, 0))
    cache.remember_agent(("fleet-a", "new"), None)
    assert cache.agent(("fleet-a", "new")) == (True, None)
    cache.forget()
    assert cache.agent(("fleet-a", "new")) == (False, None)
    assert cache.rules("fleet-a") is None
