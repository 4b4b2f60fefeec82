"""DecideWriteBatches: several gate requests in one call, each decided as if sent alone."""

from __future__ import annotations

import grpc
import pytest

from engram.client._errors import EngramRpcError
from engram.client.governance import GovernanceClient
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.errors import ResourceExhausted
from tests.integration.governance.conftest import GovClientFactory, refused
from tests.integration.governance.test_contract import candidate
from tests.scans import Held, third_scan_is_busy


def _request(agent: str, request_id: str, *contents: str) -> pb.DecideWritesRequest:
    return pb.DecideWritesRequest(fleet_id="fleet-a", agent_id=agent, request_id=request_id,
                                  candidates=[candidate(c) for c in contents])


def _refused(call, code: grpc.StatusCode, reason: str) -> EngramRpcError:  # type: ignore[no-untyped-def]
    error = refused(call)
    assert (error.code, error.reason) == (code, reason), error
    return error


def test_each_request_of_a_batch_is_decided_and_replayed_as_if_sent_alone(
        shard_service: GovernanceClient, governor: GovernanceClient) -> None:
    governor.add_rule(pb.Rule(deny_pattern=pb.DenyPattern(pattern="forbidden")),
                      request_id="deny-forbidden")
    batch = [_request("agent-1", "req-a", "the build runs on two cores"),
             _request("agent-2", "req-b", "caches expire after an hour",
                      "this one is forbidden"),
             _request("agent-1", "req-c", "deploys happen on tuesdays")]
    first = shard_service.decide_batches(batch)
    assert [r.WhichOneof("result") for r in first.results] == ["reply"] * 3
    replies = [r.reply for r in first.results]
    assert [r.status for r in replies] == [pb.GATE_STATUS_DECIDED] * 3
    assert [[d.allowed for d in r.decisions] for r in replies] == [[True], [True, False],
                                                                   [True]]
    assert [r.replayed for r in replies] == [False] * 3
    assert [d.agent_id for r in replies for d in r.decisions] == \
        ["agent-1", "agent-2", "agent-2", "agent-1"]
    assert len({d.chain_seq for r in replies for d in r.decisions}) == 4  # each its own entry
    ids = [[d.decision_id for d in r.decisions] for r in replies]

    again = shard_service.decide_batches(batch)  # a retry records nothing new
    assert [r.reply.replayed for r in again.results] == [True] * 3
    assert [[d.decision_id for d in r.reply.decisions] for r in again.results] == ids
    alone = shard_service.decide("fleet-a", "agent-2", "req-b",
                                 [candidate("caches expire after an hour"),
                                  candidate("this one is forbidden")])
    assert alone.replayed and [d.decision_id for d in alone.decisions] == ids[1]
    assert len(list(governor.decisions())) == 4
    assert governor.verify_chain().ok


def test_a_request_that_fails_alone_gets_its_error_and_the_others_their_decisions(
        shard_service: GovernanceClient, governor: GovernanceClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The group fails as a whole, is decided again one request at a time, and only the
    request that fails alone carries an error."""
    from services.governance import service as service_module

    decide = service_module._GateGroup.decide

    def failing_for_agent_9(group: object, request: service_module.GateRequest
                            ) -> service_module.GateOutcome:
        if request.agent_id == "agent-9":
            raise ResourceExhausted("agent-9 is over its budget", reason="RATE_LIMITED",
                                    metadata={"agent_id": "agent-9"}, retry_delay=2.5)
        return decide(group, request)  # type: ignore[arg-type]

    monkeypatch.setattr(service_module._GateGroup, "decide", failing_for_agent_9)
    answer = shard_service.decide_batches([_request("agent-1", "req-1", "first note"),
                                           _request("agent-9", "req-9", "second note"),
                                           _request("agent-2", "req-2", "third note")])
    kinds = [r.WhichOneof("result") for r in answer.results]
    assert kinds == ["reply", "error", "reply"]
    error = answer.results[1].error
    assert (error.code, error.reason) == ("RESOURCE_EXHAUSTED", "RATE_LIMITED")
    assert "over its budget" in error.message
    assert dict(error.metadata) == {"agent_id": "agent-9"}
    assert error.retry_delay.ToMilliseconds() == 2500
    assert not answer.results[0].HasField("error")
    assert sorted(d.agent_id for d in governor.decisions()) == ["agent-1", "agent-2"]


def test_bad_batches_are_refused_whole_and_record_nothing(
        shard_service: GovernanceClient, governor: GovernanceClient,
        gov_for: GovClientFactory) -> None:
    code = grpc.StatusCode.INVALID_ARGUMENT
    _refused(lambda: shard_service.decide_batches([]), code, "INVALID_CANDIDATE")
    bad = _request("agent-2", "req-bad", "fine")
    bad.candidates[0].record_id = ".."
    error = _refused(lambda: shard_service.decide_batches(
        [_request("agent-1", "req-ok", "a good note"), bad]), code, "INVALID_IDENTIFIER")
    assert error.message.startswith("requests[1]: ")
    _refused(lambda: shard_service.decide_batches(
        [_request("agent-1", "req-ok", "a good note"), _request("agent-1", "", "no id")]),
        code, "REQUEST_ID_REQUIRED")
    error = _refused(lambda: shard_service.decide_batches(
        [_request("agent-1", f"req-{i}", f"note {i}") for i in range(129)]),
        code, "LIMIT_EXCEEDED")
    assert "requests is 129" in error.message
    error = _refused(lambda: shard_service.decide_batches(
        [_request("agent-1", "req-x", *[f"x{i}" for i in range(600)]),
         _request("agent-2", "req-y", *[f"y{i}" for i in range(401)])]),
        code, "LIMIT_EXCEEDED")
    assert "ENGRAM_LIMITS_BATCH_ITEMS" in error.message
    assert list(governor.decisions()) == []

    for caller in (governor, gov_for("agent-1", "fleet-a", ("agent",)),
                   gov_for("svc-compactor", "system", ("service",))):
        _refused(lambda c=caller: c.decide_batches([_request("agent-1", "req-z", "note")]),
                 grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED")
    assert list(governor.decisions()) == []


def test_a_request_that_breaks_alone_does_not_fail_the_others_recorded_decisions(
        shard_service: GovernanceClient, governor: GovernanceClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error in one request is that request's INTERNAL result: failing the whole
    call would leave the others' decisions recorded and have the shard ask for them again."""
    from services.governance import service as service_module

    decide = service_module._GateGroup.decide

    def broken_for_agent_7(group: object, request: service_module.GateRequest
                           ) -> service_module.GateOutcome:
        if request.agent_id == "agent-7":
            raise RuntimeError("a bug")
        return decide(group, request)  # type: ignore[arg-type]

    monkeypatch.setattr(service_module._GateGroup, "decide", broken_for_agent_7)
    answer = shard_service.decide_batches([_request("agent-1", "req-1", "first note"),
                                           _request("agent-7", "req-7", "second note")])
    assert answer.results[0].WhichOneof("result") == "reply"
    error = answer.results[1].error
    assert (error.code, error.reason) == ("INTERNAL", "GATE_REQUEST_FAILED")
    assert "a bug" not in error.message  # no internals in what callers read
    assert [d.agent_id for d in governor.decisions()] == ["agent-1"]


def test_two_chain_verifications_at_once_and_the_gate_still_decides(
        shard_service: GovernanceClient, gov_for: GovClientFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review (2026-11-29): VerifyChain replays every fleet's history and had no
    limit of its own; eight at once, from one governor, took every worker and another fleet's
    gate got CONCURRENCY_LIMIT. Now a third at once is SCAN_BUSY and the gate goes on."""
    from services.governance.service import GovernanceService

    held = Held()
    monkeypatch.setattr(GovernanceService, "verify_chain",
                        held.wrap(GovernanceService.verify_chain))
    governors = [gov_for(f"gov-{i}", "fleet-b") for i in range(3)]
    started = iter(governors[:2])

    def gate_decides() -> None:
        reply = shard_service.decide("fleet-c", "agent-9", "req-9",
                                     [candidate("the gate is not held by the scans")])
        assert reply.decisions[0].allowed

    third_scan_is_busy(held, lambda: next(started).verify_chain(), governors[2].verify_chain,
                       gate_decides, enter_within=10)
    assert governors[2].verify_chain().ok  # a slot is free again
