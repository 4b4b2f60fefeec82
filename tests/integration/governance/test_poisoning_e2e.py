"""Shard + governance as two servers over real gRPC: the poisoning scenario and failing closed.

The shard is reached only through its gRPC API; governance only through its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from engram.client import ShardClient
from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.server import EngramServer
from services.common.tokens import write_token_file
from services.governance.server import build_governance_server
from services.governance.settings import GovernanceSettings
from services.shard.governance_gate import connect_governance
from services.shard.server import build_shard_server
from services.shard.settings import ShardSettings
from tests.conftest import TokenFactory


@dataclass
class Deployment:
    governance: EngramServer
    shard: EngramServer
    tokens: TokenFactory

    def shard_client(self, agent: str) -> ShardClient:
        return ShardClient(self.shard.address, self.tokens(agent, "fleet-a", ("agent",)))

    def governor(self) -> GovernanceClient:
        return GovernanceClient(self.governance.address,
                                self.tokens("ops", "fleet-a", ("governor",)))


@pytest.fixture
def deployment(tmp_path: Path, engram_home: Path,
               make_token: TokenFactory) -> Iterator[Deployment]:
    gov_settings = GovernanceSettings(home=engram_home, port=0,
                                      db_url=f"sqlite:///{tmp_path / 'governance.db'}")
    governance = build_governance_server(gov_settings)
    governance.start()
    token_file = tmp_path / "shard-service.token"
    write_token_file(token_file, make_token("svc-shard", "system", ("service",)))
    gate, trust = connect_governance(governance.address, token_file, gate_timeout=2.0,
                                     ttl_seconds=0.0)
    shard_settings = ShardSettings(home=engram_home, port=0,
                                   db_url=f"sqlite:///{tmp_path / 'shard.db'}")
    shard, _service = build_shard_server(shard_settings, gate=gate, trust=trust)
    shard.start()
    try:
        yield Deployment(governance, shard, make_token)
    finally:
        shard.stop(0)
        governance.stop(0)


def _denied(call: object) -> EngramRpcError:
    assert callable(call)
    with pytest.raises(EngramRpcError) as error:
        call()
    return error.value


def test_poisoning_scenario(deployment: Deployment) -> None:
    honest, mallory, shady = (deployment.shard_client(a) for a in ("honest", "mallory", "shady"))
    governor = deployment.governor()
    honest.add("The payments API requires auth tokens for every call", domain="technical")
    mallory.add("Payments settlement runs nightly at 02:00 UTC", domain="technical")
    assert any(h.record.agent_id == "mallory" for h in honest.search("payments settlement"))

    governor.set_tier("mallory", "suspended", reason="poisoning")
    denied = _denied(lambda: mallory.add("Payments settlement is disabled", domain="technical"))
    assert denied.code == grpc.StatusCode.PERMISSION_DENIED
    assert "builtin:suspended" in denied.metadata["rule_ids"]
    assert all(h.record.agent_id != "mallory" for h in honest.search("payments settlement"))

    contradiction = governor.add_rule(pb.Rule(contradiction=pb.Contradiction(),
                                              tiers=[pb.TRUST_TIER_PROBATION])).rule
    governor.set_tier("shady", "probation")
    clash = _denied(lambda: shady.add("The payments API does not require auth tokens",
                                      domain="technical"))
    assert clash.code == grpc.StatusCode.PERMISSION_DENIED
    assert contradiction.rule_id in clash.metadata["rule_ids"]
    shady.add("Refunds are processed by the billing team", domain="technical")
    # A suspended agent's statement is no neighbour to judge others by: shady corrects
    # mallory's false one (before 2026-11-30 denied as a contradiction of it, found by review)
    mallory_lie = "Payments settlement does not need a reconciliation report"
    governor.set_tier("mallory", "trusted")
    mallory.add(mallory_lie, domain="technical")
    governor.set_tier("mallory", "suspended", reason="poisoning again")
    corrected = shady.add("Payments settlement needs a reconciliation report",
                          domain="technical")
    assert corrected.created

    stored = list(honest.list())
    allowed = {d.record_id for d in governor.decisions() if d.allowed}
    assert stored and {r.id for r in stored} <= allowed
    for client in (honest, mallory, shady, governor):
        client.close()


def test_governance_down_fails_writes_closed_and_reads_fall_back(
        deployment: Deployment) -> None:
    writer = deployment.shard_client("writer")
    writer.add("Cache invalidation happens on deploy", domain="technical")
    before = [r.id for r in writer.list()]
    deployment.governance.stop(0)
    down = _denied(lambda: writer.add("A second fact about caches", domain="technical"))
    assert down.code == grpc.StatusCode.UNAVAILABLE
    assert [r.id for r in writer.list()] == before
    hits = writer.search("cache invalidation deploy")
    assert [h.record.id for h in hits] == before, "trust unreachable on read -> multiplier 1.0"
    writer.close()
