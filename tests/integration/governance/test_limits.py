"""Governance's inputs have limits: ids, NUL bytes, batch sizes, forged page tokens."""

from __future__ import annotations

import base64
import hashlib
import json

import grpc
import pytest

from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.server import EngramServer
from services.shard.governance_gate import GATE_SEND_BYTES
from tests.conftest import TokenFactory
from tests.integration.governance.conftest import GovClientFactory
from tests.integration.governance.test_contract import candidate


def _refused(call, reason: str) -> EngramRpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(EngramRpcError) as caught:
        call()
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert caught.value.reason == reason, caught.value
    return caught.value


def test_nul_bytes_are_refused_before_the_database(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    _refused(lambda: governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="x"),
                                               description="bad\x00rule")), "NUL_CHARACTER")
    _refused(lambda: governor.set_tier("agent-1", "probation", reason="r\x00"), "NUL_CHARACTER")
    _refused(lambda: shard_service.decide("fleet-a", "agent-1", "req-n",
                                          [candidate("content with a \x00 in it")]),
             "NUL_CHARACTER")
    assert list(governor.rules()) == []
    assert list(governor.decisions()) == []


def test_ids_and_batches_are_checked(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    bad = candidate("fine")
    bad.record_id = ".."
    _refused(lambda: shard_service.decide("fleet-a", "agent-1", "req-i", [bad]),
             "INVALID_IDENTIFIER")
    error = _refused(lambda: shard_service.decide(
        "fleet-a", "agent-1", "req-b", [candidate(f"c{i}") for i in range(1001)]),
        "LIMIT_EXCEEDED")
    assert "ENGRAM_LIMITS_BATCH_ITEMS" in error.message
    _refused(lambda: governor.trusts("fleet-a", ["..", "agent-1"]), "INVALID_IDENTIFIER")
    _refused(lambda: shard_service.decide("fleet-a", "agent-1", "..", [candidate("fine")]),
             "INVALID_REQUEST_ID")
    _refused(lambda: governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="x")),
                                       request_id="a b"), "INVALID_REQUEST_ID")
    _refused(lambda: governor.remove_rule(".."), "INVALID_IDENTIFIER")
    _refused(lambda: list(governor.decisions(agent_id="a\x01")), "INVALID_IDENTIFIER")


def test_forged_and_other_callers_page_tokens_are_refused(gov_for: GovClientFactory) -> None:
    alice, bob = gov_for("alice"), gov_for("bob")
    for n in range(3):
        alice.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern=f"secret{n}")))
    digest = hashlib.sha256(json.dumps({"fleet_id": "fleet-a"}, sort_keys=True,
                                       separators=(",", ":")).encode()).hexdigest()[:16]
    forged = base64.urlsafe_b64encode(
        json.dumps({"k": [{"x": 1}], "f": digest}).encode()).decode().rstrip("=")

    def page(client: GovernanceClient, token: str) -> pb.ListRulesResponse:
        return client.call(client.stub.ListRules,
                           pb.ListRulesRequest(page_size=2, page_token=token))

    _refused(lambda: page(alice, forged), "INVALID_PAGE_TOKEN")
    token = page(alice, "").next_page_token
    assert len(page(alice, token).rules) == 1
    _refused(lambda: page(bob, token), "INVALID_PAGE_TOKEN")


def test_a_gate_call_may_carry_more_than_a_client_request(
        governance: EngramServer, make_token: TokenFactory) -> None:
    """A batch with its neighbours outgrows 4 MiB; governance takes up to 64 MiB from the gate."""
    big = [candidate(f"record {i}", neighbours=tuple((f"n{i}-{j}", "word " * 20_000)
                                                     for j in range(5))) for i in range(10)]
    with GovernanceClient(governance.address, make_token("svc-shard", "system", ("service",)),
                          max_send_bytes=GATE_SEND_BYTES) as gate:
        reply = gate.decide("fleet-a", "agent-1", "req-big", big)
    assert len(reply.decisions) == 10
