"""Every RPC has an authorization entry; the shard adapter caches trust and fails closed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import grpc
import pytest

from engram.client._errors import EngramRpcError
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.auth import SHARD_SERVICE, Authorizer, target_fleet
from services.common.errors import PermissionDenied, Unavailable
from services.common.tokens import Principal
from services.governance.servicer import POLICY, SERVICE_NAME, is_gate_caller
from services.shard.domain.compaction import SOURCE_AUTHORS_KEY
from services.shard.domain.records import Record
from services.shard.governance_gate import TRUST_BATCH, GovernanceGate, GovernanceTrust
from services.shard.ports import GateCandidate, Neighbour
from services.shard.search.engine import MAX_SOURCE_AUTHORS, record_authors


def test_every_method_has_a_policy_entry() -> None:
    methods = pb.DESCRIPTOR.services_by_name["GovernanceService"].methods
    assert {f"/{SERVICE_NAME}/{m.name}" for m in methods} == set(POLICY)
    writes = ("SetTier", "CreateRule", "DeleteRule", "RevokeToken", "RevokeAgentTokens")
    for name in writes:
        assert POLICY[f"/{SERVICE_NAME}/{name}"] == frozenset({"governor", "admin"})
    assert POLICY[f"/{SERVICE_NAME}/DecideWrites"] == frozenset({SHARD_SERVICE})
    assert POLICY[f"/{SERVICE_NAME}/DecideWriteBatches"] == frozenset({SHARD_SERVICE})
    service_methods = {name.rsplit("/", 1)[1] for name, kinds in POLICY.items()
                       if any(kind.startswith("service") for kind in kinds)}
    assert service_methods == {"DecideWrites", "DecideWriteBatches", "BatchGetTrust",
                               "ListAccessRestrictions", "GetErasure"}


def test_target_fleet_is_the_callers_own_unless_a_gate_caller() -> None:
    governor = Principal("a", "fleet-a", frozenset({"governor"}))
    admin = Principal("root", "fleet-a", frozenset({"admin"}))
    assert target_fleet(governor, "") == "fleet-a"
    for principal in (governor, admin):
        with pytest.raises(PermissionDenied) as refused:
            target_fleet(principal, "fleet-b")
        assert refused.value.reason == "FLEET_MISMATCH"
    service = Principal("svc-shard", "system", frozenset({"service"}))
    assert target_fleet(service, "fleet-b", cross_fleet=True) == "fleet-b"
    with pytest.raises(PermissionDenied):
        target_fleet(service, "fleet-b")


def test_the_gate_caller_is_the_shards_service_principal() -> None:
    assert is_gate_caller(Principal("svc-shard", "system", frozenset({"service"})))
    assert not is_gate_caller(Principal("svc-shard", "system", frozenset({"agent"})))
    compactor = Principal("svc-compactor", "system", frozenset({"service"}))
    assert not is_gate_caller(compactor)
    assert not is_gate_caller(Principal("svc-shard-2", "system", frozenset({"service"})))

    class _Verifier:
        def verify(self, _token: str) -> Principal:
            return compactor

    authorizer = Authorizer(_Verifier(), POLICY)  # type: ignore[arg-type]
    with pytest.raises(PermissionDenied) as refused:
        authorizer.authorize(f"/{SERVICE_NAME}/DecideWrites", {"authorization": "Bearer x"})
    assert refused.value.reason == "ROLE_REQUIRED"


class _FakeGovernance:
    """A governance client double: answers from a table, counts calls, can be 'down'."""

    def __init__(self) -> None:
        self.calls = 0
        self.down = False
        self.tiers = {"good": 1.25, "bad": 0.0}

    def trusts(self, fleet_id: str, agent_ids: Sequence[str]) -> list[pb.AgentTrust]:
        self.calls += 1
        if self.down:
            raise EngramRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")
        return [pb.AgentTrust(fleet_id=fleet_id, agent_id=a, multiplier=self.tiers.get(a, 1.0))
                for a in agent_ids]

    def decide(self, *_args: object, **_kwargs: object) -> pb.DecideWritesResponse:
        raise EngramRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline")


def test_trust_cache_and_failure() -> None:
    fake, now = _FakeGovernance(), [0.0]
    trust = GovernanceTrust(fake, ttl_seconds=1.5, clock=lambda: now[0])  # type: ignore[arg-type]
    assert trust.multipliers("f", ["good", "bad", "new"]) == {"good": 1.25, "bad": 0.0, "new": 1.0}
    assert trust.multipliers("f", ["good", "bad"]) == {"good": 1.25, "bad": 0.0}
    assert fake.calls == 1
    now[0] = 2.0
    fake.down = True
    # Governance down past the TTL: the last known multipliers stay in force (a suspension
    # too); only an agent never seen is left out (ranked 1.0 by the caller).
    assert trust.multipliers("f", ["good", "bad", "never-seen"]) == {"good": 1.25, "bad": 0.0}
    fake.down = False
    fake.tiers["bad"] = 1.0
    assert trust.multipliers("f", ["bad"]) == {"bad": 1.0}  # back up: fresh answers again


def test_a_refused_trust_lookup_ranks_agents_never_seen_at_zero_not_one() -> None:
    """A lookup governance answers with a refusal is not an outage: ranking everyone it named
    at 1.0 would bring a suspended agent's records back into search (a writer could make
    governance refuse a search's lookup by naming a malformed author)."""
    fake, now = _FakeGovernance(), [0.0]
    trust = GovernanceTrust(fake, ttl_seconds=1.5, clock=lambda: now[0])  # type: ignore[arg-type]
    assert trust.multipliers("f", ["good"]) == {"good": 1.25}
    now[0] = 2.0

    def refuse(fleet_id: str, agent_ids: Sequence[str]) -> list[pb.AgentTrust]:
        raise EngramRpcError(grpc.StatusCode.INVALID_ARGUMENT, "agent_id 'x y' may hold only")

    fake.trusts = refuse  # type: ignore[method-assign]
    assert trust.multipliers("f", ["good", "bad"]) == {"good": 1.25, "bad": 0.0}


def test_trust_lookups_go_in_parts_governance_takes() -> None:
    fake = _FakeGovernance()
    sizes: list[int] = []
    answer = fake.trusts

    def counted(fleet_id: str, agent_ids: Sequence[str]) -> list[pb.AgentTrust]:
        sizes.append(len(agent_ids))
        return answer(fleet_id, agent_ids)

    fake.trusts = counted  # type: ignore[method-assign]
    trust = GovernanceTrust(fake)  # type: ignore[arg-type]
    names = [f"agent-{i}" for i in range(TRUST_BATCH * 2 + 1)] + ["bad"]
    found = trust.multipliers("f", names)
    assert len(found) == len(names) and found["bad"] == 0.0
    assert sizes == [TRUST_BATCH, TRUST_BATCH, 2]


_RECORD = Record(id="r-1", fleet_id="f", run_id="run", agent_id="writer", content="c",
                 content_hash="h", record_hash="rh", domain="", source="", importance=0.5,
                 tags=(), metadata={}, cross_refs=(), created_us=1)


def test_source_authors_that_are_not_agent_ids_are_left_out() -> None:
    def authors(value: str) -> frozenset[str] | None:
        record = dataclasses.replace(_RECORD, metadata={SOURCE_AUTHORS_KEY: value})
        return record_authors(record)

    assert authors('["scout-1", "scout-2"]') == {"writer", "scout-1", "scout-2"}
    assert authors('["not an id!", "", 7, "' + "a" * 129 + '", "..", "ok@x"]') == {
        "writer", "ok@x"}
    assert authors("[" * 5000) == {"writer"}  # past the JSON parser's depth: free text
    assert authors("free text") == {"writer"}


def test_a_record_naming_more_authors_than_the_bound_ranks_at_zero() -> None:
    def authors(names: list[str]) -> frozenset[str] | None:
        record = dataclasses.replace(_RECORD, metadata={SOURCE_AUTHORS_KEY: json.dumps(names)})
        return record_authors(record)

    bound = [f"a-{i}" for i in range(MAX_SOURCE_AUTHORS)]
    assert authors(bound) == {"writer", *bound}
    # repeated names, the writer itself and names that are not ids do not count
    assert authors([*bound, *bound, "writer", "not an id!"]) == {"writer", *bound}
    assert authors([*bound, "one-more"]) is None


def test_gate_fails_closed() -> None:
    gate = GovernanceGate(_FakeGovernance())  # type: ignore[arg-type]
    candidate = GateCandidate("r", "h", "c", "", "d", "", 0.5, ())
    with pytest.raises(Unavailable, match="nothing was stored"):
        gate.decide("f", "a", [candidate], "req", lambda _c: [])


class _ScriptedDecide:
    """DecideWrites answering by a fixed policy: which agents need neighbours, which status."""

    def __init__(self, needy: set[str], *, status_when_omitted: int | None = None) -> None:
        self.needy = needy
        self.status_when_omitted = status_when_omitted
        self.needy_even_with_neighbours = False
        self.sent: list[tuple[str, bool, int]] = []

    def decide(self, fleet_id: str, agent_id: str, request_id: str,
               candidates: Sequence[pb.WriteCandidate], *,
               neighbours_omitted: bool = False) -> pb.DecideWritesResponse:
        self.sent.append((request_id, neighbours_omitted,
                          sum(len(c.neighbours) for c in candidates)))
        if neighbours_omitted and self.status_when_omitted is not None:
            return pb.DecideWritesResponse(status=self.status_when_omitted)  # type: ignore[arg-type]
        if agent_id in self.needy and (neighbours_omitted or self.needy_even_with_neighbours):
            return pb.DecideWritesResponse(status=pb.GATE_STATUS_NEEDS_NEIGHBOURS)
        return pb.DecideWritesResponse(status=pb.GATE_STATUS_DECIDED, decisions=[
            pb.GateDecision(decision_id=f"d-{c.record_id}", allowed=True) for c in candidates])


def _neighbour_search(calls: list[str]) -> Callable[[GateCandidate], list[Neighbour]]:
    def find(candidate: GateCandidate) -> list[Neighbour]:
        calls.append(candidate.record_id)
        return [Neighbour("old", "an older record", "other", 1.0)]
    return find


def test_gate_asks_without_neighbours_and_searches_only_when_told() -> None:
    fake, now = _ScriptedDecide({"shady"}), [0.0]
    searched: list[str] = []
    gate = GovernanceGate(fake, hint_seconds=5.0, clock=lambda: now[0])  # type: ignore[arg-type]
    two = [GateCandidate(r, "h", "c", "", "d", "", 0.5, ()) for r in ("r1", "r2")]
    assert [d.decision_id for d in gate.decide("f", "good", two, "q1",
                                               _neighbour_search(searched))] == ["d-r1", "d-r2"]
    assert searched == [] and fake.sent == [("q1", True, 0)]

    fake.sent.clear()
    assert len(gate.decide("f", "shady", two, "q2", _neighbour_search(searched))) == 2
    assert searched == ["r1", "r2"]
    assert fake.sent == [("q2", True, 0), ("q2", False, 2)], "same request_id, with neighbours"

    fake.sent.clear()
    gate.decide("f", "shady", two[:1], "q3", _neighbour_search(searched))
    assert fake.sent == [("q3", False, 1)], "remembered: neighbours sent straight away"
    now[0] = 6.0
    fake.sent.clear()
    gate.decide("f", "shady", two[:1], "q4", _neighbour_search(searched))
    assert fake.sent == [("q4", True, 0), ("q4", False, 1)], "the hint expired: ask again"


def test_gate_fails_closed_when_an_older_governance_ignores_neighbours_omitted() -> None:
    fake = _ScriptedDecide(set(), status_when_omitted=pb.GATE_STATUS_UNSPECIFIED)
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    candidate = GateCandidate("r", "h", "c", "", "d", "", 0.5, ())
    with pytest.raises(Unavailable, match="does not support neighbours_omitted"):
        gate.decide("f", "a", [candidate], "req", lambda _c: [])


def test_gate_fails_closed_when_asked_for_neighbours_it_sent() -> None:
    fake = _ScriptedDecide({"a"})
    fake.needy_even_with_neighbours = True
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    candidate = GateCandidate("r", "h", "c", "", "d", "", 0.5, ())
    with pytest.raises(Unavailable, match="nothing was stored"):
        gate.decide("f", "a", [candidate], "req", lambda _c: [])
    assert [omitted for _, omitted, _ in fake.sent] == [True, False]


def test_one_fleets_many_agents_do_not_flush_another_fleets_demotions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: past the cache's size every entry but suspensions was dropped, so a
    fleet with many agent ids evicted another fleet's demoted agents, and with governance then
    down they ranked at 1.0 instead of their demotion."""
    fake, now = _FakeGovernance(), [0.0]
    fake.tiers["probation"] = 0.5
    monkeypatch.setattr(GovernanceTrust, "CACHE_AGENTS", 10)
    trust = GovernanceTrust(fake, ttl_seconds=1.5, clock=lambda: now[0])  # type: ignore[arg-type]
    assert trust.multipliers("fleet-b", ["probation", "bad"]) == {"probation": 0.5, "bad": 0.0}
    for part in range(3):  # fleet A's many agents fill the cache past its size
        trust.multipliers("fleet-a", [f"agent-{part}-{i}" for i in range(10)])
    now[0] = 2.0
    fake.down = True
    assert trust.multipliers("fleet-b", ["probation", "bad"]) == {"probation": 0.5, "bad": 0.0}
