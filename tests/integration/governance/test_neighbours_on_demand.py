"""Neighbours only on demand: the shard's neighbour search runs only when a contradiction rule
applies to the writer, and asking without neighbours never weakens the gate.

Governance side on SQLite and Postgres (repository and real gRPC); shard + governance as two
real servers, with the shard's neighbour search counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from engram.client import ShardClient, record_input
from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.db import Database
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.governance.domain.rules import Candidate, Neighbour, Rule, RuleKind
from services.governance.domain.tiers import TrustTier
from services.governance.server import build_governance_server
from services.governance.service import GateRequest, GovernanceService
from services.governance.settings import GovernanceSettings
from services.shard.governance_gate import connect_governance
from services.shard.ports import Neighbour as ShardNeighbour
from services.shard.server import build_shard_server
from services.shard.service import ShardService
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory
from tests.integration.governance.test_contract import candidate as wire_candidate

FLEET = "fleet-a"
EXISTING = (Neighbour("rec-old", "The payments API requires auth tokens", "honest"),)


def _candidate(content: str, neighbours: tuple[Neighbour, ...] = ()) -> Candidate:
    digest = hashlib.sha256(content.encode()).hexdigest()
    return Candidate(record_id="rec-" + digest[:12], content_hash=digest, content=content,
                     neighbours=neighbours)


class _Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        self.ms += 1
        return self.ms


@pytest.fixture
def repo(database: Database) -> GovernanceService:
    return GovernanceService(database, _Clock())


def _add(repo: GovernanceService, rule_id: str, kind: RuleKind, params: dict[str, object],
         tiers: tuple[TrustTier, ...] = ()) -> None:
    repo.create_rule(Rule(rule_id, FLEET, kind, params, tiers=tiers, created_ms=repo.now_ms()))


def test_without_a_contradiction_rule_the_request_is_decided_without_neighbours(
        repo: GovernanceService) -> None:
    _add(repo, "r-contra", RuleKind.CONTRADICTION, {"min_overlap": 0.6},
         (TrustTier.PROBATION,))
    outcome = repo.decide(FLEET, "regular", "q1", [_candidate("Deploys happen on Tuesdays")],
                          neighbours_omitted=True)
    assert not outcome.needs_neighbours
    assert [d.allowed for d in outcome.decisions] == [True]


def test_needs_neighbours_records_and_counts_nothing_then_the_full_request_is_denied(
        repo: GovernanceService) -> None:
    _add(repo, "r-contra", RuleKind.CONTRADICTION, {"min_overlap": 0.6},
         (TrustTier.PROBATION,))
    repo.set_tier(FLEET, "shady", TrustTier.PROBATION, "gov", "watch")
    before, trust_before = repo.checkpoint(), repo.trust_of(FLEET, ["shady"])["shady"]
    clash = "The payments API does not require auth tokens"
    asked = repo.decide(FLEET, "shady", "q1", [_candidate(clash)], neighbours_omitted=True)
    assert asked.needs_neighbours and asked.decisions == []
    assert repo.checkpoint() == before
    assert repo.trust_of(FLEET, ["shady"])["shady"] == trust_before

    denied = repo.decide(FLEET, "shady", "q1", [_candidate(clash, EXISTING)])
    assert [d.rule_ids for d in denied.decisions] == [("r-contra",)]
    assert repo.checkpoint().length == before.length + 1
    trust_after = repo.trust_of(FLEET, ["shady"])["shady"]
    again = repo.decide(FLEET, "shady", "q1", [_candidate(clash, EXISTING)])
    assert again.replayed and again.decisions == denied.decisions
    assert repo.trust_of(FLEET, ["shady"])["shady"] == trust_after
    assert repo.verify()[1] == []


def test_a_tier_that_drops_mid_request_is_caught_before_anything_is_recorded(
        repo: GovernanceService) -> None:
    """Three denials take a new agent to probation, where the contradiction rule applies."""
    _add(repo, "r-deny", RuleKind.DENY_PATTERN, {"pattern": "forbidden", "case_sensitive": False})
    _add(repo, "r-contra", RuleKind.CONTRADICTION, {"min_overlap": 0.6},
         (TrustTier.PROBATION,))
    before = repo.checkpoint()
    batch = [_candidate(f"forbidden note {n}") for n in range(3)]
    batch.append(_candidate("The payments API does not require auth tokens"))
    asked = repo.decide(FLEET, "newbie", "q1", batch, neighbours_omitted=True)
    assert asked.needs_neighbours
    assert repo.checkpoint() == before
    assert repo.trust_of(FLEET, ["newbie"])["newbie"].tier is TrustTier.STANDARD
    full = [*batch[:3], _candidate(batch[3].content, EXISTING)]
    decided = repo.decide(FLEET, "newbie", "q1", full)
    assert [d.rule_ids for d in decided.decisions] == [("r-deny",)] * 3 + [("r-contra",)]


def test_a_request_sent_back_for_neighbours_uses_no_rate_in_its_group(
        repo: GovernanceService) -> None:
    _add(repo, "r-rate", RuleKind.RATE_LIMIT, {"max_writes": 1, "window_seconds": 60})
    _add(repo, "r-contra", RuleKind.CONTRADICTION, {"min_overlap": 0.6})
    group = [GateRequest(FLEET, "agent-1", "g1", (_candidate("first note"),),
                         neighbours_omitted=True),
             GateRequest(FLEET, "agent-1", "g2", (_candidate("second note", EXISTING),))]
    outcomes = repo._decide_group(group)
    assert [o.needs_neighbours for o in outcomes] == [True, False]
    assert outcomes[1].decisions[0].allowed
    assert repo.checkpoint().length == 1 + 1 + 1
    assert repo.verify()[1] == []


def test_the_rpc_answers_needs_neighbours_and_refuses_mixed_requests(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    governor.add_rule(pb.Rule(contradiction=pb.Contradiction()))
    asked = shard_service.decide(FLEET, "agent-1", "r1", [wire_candidate("a fact")],
                                 neighbours_omitted=True)
    assert asked.status == pb.GATE_STATUS_NEEDS_NEIGHBOURS and not asked.decisions
    assert list(governor.decisions()) == []
    decided = shard_service.decide(FLEET, "agent-1", "r1", [wire_candidate("a fact")])
    assert decided.status == pb.GATE_STATUS_DECIDED and decided.decisions[0].allowed
    with pytest.raises(EngramRpcError) as error:
        shard_service.decide(FLEET, "agent-1", "r2", [wire_candidate(
            "another fact", neighbours=(("rec-old", "a fact"),))], neighbours_omitted=True)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT


# -- shard + governance, the neighbour search counted ------------------------------------


@dataclass
class Stack:
    governance: EngramServer
    shard: EngramServer
    service: ShardService
    tokens: TokenFactory
    searches: list[str]

    def writer(self, agent: str) -> ShardClient:
        return ShardClient(self.shard.address, self.tokens(agent, FLEET, ("agent",)))


@pytest.fixture
def stack(tmp_path: Path, engram_home: Path, make_token: TokenFactory) -> Iterator[Stack]:
    governance = build_governance_server(GovernanceSettings(
        home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'governance.db'}"))
    governance.start()
    token_file = tmp_path / "shard-service.token"
    write_token_file(token_file, make_token("svc-shard", "system", ("service",)))
    gate, trust = connect_governance(governance.address, token_file, gate_timeout=10.0,
                                     ttl_seconds=0.0)
    shard, service = build_shard_server(
        ShardSettings(home=engram_home, port=0, db_url=f"sqlite:///{tmp_path / 'shard.db'}"),
        gate=gate, trust=trust)
    searches: list[str] = []
    search = service.search_engine.neighbours

    def counted(fleet_id: str, content: str, limit: int = 5) -> list[ShardNeighbour]:
        searches.append(content)
        return search(fleet_id, content, limit)

    service.search_engine.neighbours = counted  # type: ignore[method-assign]
    shard.start()
    try:
        yield Stack(governance, shard, service, make_token, searches)
    finally:
        shard.stop(0)
        governance.stop(0)


def test_writes_search_for_neighbours_only_under_a_contradiction_rule(stack: Stack) -> None:
    honest, shady = stack.writer("honest"), stack.writer("shady")
    governor = GovernanceClient(stack.governance.address,
                                stack.tokens("ops", FLEET, ("governor",)))
    honest.add("The payments API requires auth tokens for every call", domain="technical")
    assert stack.searches == []
    rule = governor.add_rule(pb.Rule(contradiction=pb.Contradiction(),
                                     tiers=[pb.TRUST_TIER_PROBATION])).rule
    honest.add("Deploys happen on Tuesdays", domain="technical")
    assert stack.searches == [], "the rule does not apply to a standard agent"

    governor.set_tier("shady", "probation")
    clash = "The payments API does not require auth tokens"
    with pytest.raises(EngramRpcError) as error:
        shady.add(clash, domain="technical")
    assert error.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert rule.rule_id in error.value.metadata["rule_ids"]
    assert stack.searches == [clash]
    shady.add("Refunds are processed by the billing team", domain="technical")
    assert len(stack.searches) == 2

    decisions = list(governor.decisions())
    assert [d.allowed for d in sorted(decisions, key=lambda d: d.chain_seq)] == [
        True, True, False, True]
    assert {r.id for r in honest.list()} <= {d.record_id for d in decisions if d.allowed}
    assert governor.verify_chain().ok
    for client in (honest, shady, governor):
        client.close()


def test_concurrent_writes_share_gate_calls_and_each_keeps_its_own_decision(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes that arrive while a gate call is in flight go to governance together in one
    DecideWriteBatches; each write is still judged alone (a denied one fails, the others are
    stored) and each stored record carries its own recorded decision."""
    import threading
    import time

    governor = GovernanceClient(stack.governance.address,
                                stack.tokens("ops", FLEET, ("governor",)))
    governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="forbidden")))
    decide_group = GovernanceService._decide_group

    def slow_group(service: GovernanceService, requests: list[GateRequest]) -> object:
        time.sleep(0.2)  # a call stays in flight while the other writers arrive
        return decide_group(service, requests)

    monkeypatch.setattr(GovernanceService, "_decide_group", slow_group)
    writers = [stack.writer(f"agent-{n}") for n in range(16)]
    start = threading.Barrier(len(writers))
    outcomes: dict[int, object] = {}

    def write(n: int) -> None:
        start.wait()
        text = "a forbidden note" if n == 5 else f"note {n}: the queue drains at night"
        try:
            outcomes[n] = writers[n].add(text).record
        except EngramRpcError as error:
            outcomes[n] = error

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    denied = outcomes.pop(5)
    assert isinstance(denied, EngramRpcError)
    assert denied.code == grpc.StatusCode.PERMISSION_DENIED
    records = list(outcomes.values())
    assert all(not isinstance(r, BaseException) for r in records), records
    decisions = {d.decision_id: d for d in governor.decisions()}
    assert len(decisions) == 16
    for n, record in outcomes.items():
        decision = decisions[record.gate_decision_id]  # type: ignore[attr-defined]
        assert decision.allowed and decision.agent_id == f"agent-{n}"
    gate = stack.service.gate
    calls = dict(gate.calls.items())  # type: ignore[union-attr]
    assert calls.get(("batch",), 0) >= 1, calls
    assert dict(gate.requests.items()) == {(): 16}  # type: ignore[union-attr]
    assert sum(calls.values()) < 16  # fewer calls than writes
    assert governor.verify_chain().ok


def test_a_batch_whose_neighbours_pass_the_gate_budget_is_refused_and_stores_nothing(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 records each with 5 neighbours of 32 KiB built a 155 MiB gate call in the shard
    (640 MB of memory), which gRPC then refused to send (found in review, 2026-11-30). The
    neighbours one call carries are bounded (lowered here to 128 KiB): past it the write is
    refused by name, with nothing stored; a call within it passes."""
    from services.shard import governance_gate

    monkeypatch.setattr(governance_gate, "GATE_NEIGHBOUR_BYTES", 128 * 1024)
    writer = stack.writer("agent-1")
    long_fact = "the payments ledger settles nightly " * 400  # about 14.5 KiB
    for n in range(5):
        writer.add(f"{long_fact} variant {n}", domain="technical")
    governor = GovernanceClient(stack.governance.address,
                                stack.tokens("ops", FLEET, ("governor",)))
    governor.add_rule(pb.Rule(contradiction=pb.Contradiction()))
    stored = {r.id for r in writer.list()}
    batch = [record_input(f"the payments ledger settles nightly, note {n}", domain="technical")
             for n in range(10)]
    with pytest.raises(EngramRpcError) as error:
        writer.add_many(batch)
    assert (error.value.code, error.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                      "GATE_TOO_LARGE"), error.value
    assert error.value.metadata["position"] == "1"  # 5 x 14.5 KiB a record: the second passes 128
    assert "send fewer records per call" in error.value.message
    assert {r.id for r in writer.list()} == stored
    writer.add_many([record_input("deploys happen on tuesdays", domain="technical")])
    assert len({r.id for r in writer.list()}) == len(stored) + 1  # a call within the budget
    for client in (writer, governor):
        client.close()
