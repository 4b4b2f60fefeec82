"""Every RPC has an authorization entry; the shard adapter caches trust and fails closed."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest

from engram.client._errors import EngramRpcError
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.errors import PermissionDenied, Unavailable
from services.common.tokens import Principal
from services.governance.servicer import POLICY, SERVICE_NAME, target_fleet
from services.shard.governance_gate import GovernanceGate, GovernanceTrust
from services.shard.ports import GateCandidate


def test_every_method_has_a_policy_entry() -> None:
    methods = pb.DESCRIPTOR.services_by_name["GovernanceService"].methods
    assert {f"/{SERVICE_NAME}/{m.name}" for m in methods} == set(POLICY)
    writes = ("SetTier", "CreateRule", "DeleteRule")
    for name in writes:
        assert POLICY[f"/{SERVICE_NAME}/{name}"] == frozenset({"governor", "admin"})
    assert POLICY[f"/{SERVICE_NAME}/DecideWrites"] == frozenset({"service"})


def test_target_fleet() -> None:
    agent = Principal("a", "fleet-a", frozenset({"governor"}))
    assert target_fleet(agent, "") == "fleet-a"
    with pytest.raises(PermissionDenied):
        target_fleet(agent, "fleet-b")
    service = Principal("svc", "system", frozenset({"service"}))
    assert target_fleet(service, "fleet-b") == "fleet-b"


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
    with pytest.raises(Unavailable):
        trust.multipliers("f", ["good"])


def test_gate_fails_closed() -> None:
    gate = GovernanceGate(_FakeGovernance())  # type: ignore[arg-type]
    candidate = GateCandidate("r", "h", "c", "", "d", "", 0.5, ())
    with pytest.raises(Unavailable, match="nothing was stored"):
        gate.decide("f", "a", [candidate], "req", lambda _c: [])
