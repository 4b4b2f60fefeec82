"""A gate call whose caller has gone (deadline passed, cancelled) stops its deny-pattern search
and records nothing. The search is the costly part of judging: a fleet's 100 patterns over a
batch of 1,000 writes of 32 KB are 100,000 RE2 searches, which went on for as long as they took
after the shard had given up on the call."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from engram.client import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.governance.domain.patterns import DenyPattern
from tests.integration.governance.test_contract import candidate

WRITES = 100
SEARCH_SECONDS = 0.05
"""Each search, slowed: the whole batch takes at least WRITES times this (5 s) unless stopped."""


@pytest.mark.parametrize("batched", [False, True], ids=["DecideWrites", "DecideWriteBatches"])
def test_a_gate_call_whose_caller_has_gone_stops_searching_and_records_nothing(
        shard_service: GovernanceClient, governor: GovernanceClient,
        monkeypatch: pytest.MonkeyPatch, batched: bool) -> None:
    governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="forbidden")),
                      request_id="deny-forbidden")
    searches = 0
    lock = threading.Lock()
    search = DenyPattern.search

    def slow(self: DenyPattern, text: str) -> bool:
        nonlocal searches
        with lock:
            searches += 1
        time.sleep(SEARCH_SECONDS)
        return search(self, text)

    monkeypatch.setattr(DenyPattern, "search", slow)
    request = pb.DecideWritesRequest(
        fleet_id="fleet-a", agent_id="agent-1", request_id="req-gone",
        candidates=[candidate(f"write number {n}") for n in range(WRITES)])
    with pytest.raises(EngramRpcError) as gone:
        if batched:
            shard_service.call(shard_service.stub.DecideWriteBatches,
                               pb.DecideWriteBatchesRequest(requests=[request]), timeout=0.3)
        else:
            shard_service.call(shard_service.stub.DecideWrites, request, timeout=0.3)
    assert gone.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    def searched() -> int:
        with lock:
            return searches

    time.sleep(1.0)  # the search under way ends; no other begins
    stopped_at = searched()
    time.sleep(10 * SEARCH_SECONDS)
    assert searched() == stopped_at < WRITES, "the search went on after its caller had gone"
    monkeypatch.undo()
    assert list(governor.decisions()) == []
    # The same request, sent again by a caller that waits, is decided in full.
    again = shard_service.decide("fleet-a", "agent-1", "req-gone", request.candidates)
    assert len(again.decisions) == WRITES and not again.replayed
