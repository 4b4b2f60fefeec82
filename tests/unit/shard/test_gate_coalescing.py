"""The shard's gate coalesces concurrent writes' calls into DecideWriteBatches, and each write
still gets its own answer: its decisions, or the error it alone got, or no answer for all."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import grpc
import pytest

from engram.client._errors import EngramRpcError
from engram.governance.v1 import governance_service_pb2 as pb
from services.common.errors import EngramError, Unavailable
from services.shard.governance_gate import GovernanceGate
from services.shard.ports import GateCandidate, GateDecision


def _decided(agent_id: str, request_id: str, count: int) -> pb.DecideWritesResponse:
    return pb.DecideWritesResponse(status=pb.GATE_STATUS_DECIDED, decisions=[
        pb.GateDecision(decision_id=f"{agent_id}/{request_id}/{i}", allowed=True)
        for i in range(count)])


class _Governance:
    """A fake GovernanceClient: the first single call waits for ``release``; batches answer
    per request, or fail as a whole with ``batch_error``; ``item_errors`` names agents whose
    request fails alone."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.singles: list[str] = []
        self.batches: list[list[str]] = []
        self.batch_error: EngramRpcError | None = None
        self.item_errors: dict[str, pb.GateError] = {}

    def decide(self, fleet_id: str, agent_id: str, request_id: str,
               candidates: Sequence[pb.WriteCandidate], *,
               neighbours_omitted: bool = False) -> pb.DecideWritesResponse:
        self.singles.append(request_id)
        if len(self.singles) == 1:
            self.started.set()
            assert self.release.wait(10)
        return _decided(agent_id, request_id, len(candidates))

    def decide_batches(self, requests: Sequence[pb.DecideWritesRequest]
                       ) -> pb.DecideWriteBatchesResponse:
        self.batches.append([r.request_id for r in requests])
        if self.batch_error is not None:
            raise self.batch_error
        return pb.DecideWriteBatchesResponse(results=[
            pb.DecideWriteBatchResult(error=self.item_errors[r.agent_id])
            if r.agent_id in self.item_errors else
            pb.DecideWriteBatchResult(reply=_decided(r.agent_id, r.request_id,
                                                     len(r.candidates)))
            for r in requests])


def _candidate(n: int) -> GateCandidate:
    return GateCandidate(f"r{n}", f"h{n}", f"content {n}", "", "d", "", 0.5, ())


Answer = list[GateDecision] | BaseException


def _concurrently(gate: GovernanceGate, fake: _Governance, writers: int,
                  candidates: int = 1) -> list[Answer]:
    """Writer 0 holds the first call; writers 1.. queue behind it, then all are let go."""
    answers: list[Answer] = [RuntimeError("no answer")] * writers

    def write(n: int) -> None:
        try:
            answers[n] = gate.decide("fleet", f"agent-{n}",
                                     [_candidate(n * 100 + i) for i in range(candidates)],
                                     f"req-{n}", lambda _c: [])
        except BaseException as error:  # reported through answers
            answers[n] = error

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    threads[0].start()
    assert fake.started.wait(10)
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 10
    while len(gate._coalescer("fleet")._queue) < writers - 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    fake.release.set()
    for thread in threads:
        thread.join(10)
    return answers


def test_writes_queued_behind_a_call_go_together_in_one_batch() -> None:
    fake = _Governance()
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    answers = _concurrently(gate, fake, 10, candidates=2)
    for n, answer in enumerate(answers):
        assert isinstance(answer, list), answer
        assert [d.decision_id for d in answer] == [f"agent-{n}/req-{n}/{i}" for i in range(2)]
    assert fake.singles == ["req-0"]
    # One batch holding every queued write; threads queue in whatever order they are run.
    assert [sorted(batch) for batch in fake.batches] == [sorted(f"req-{n}" for n in range(1, 10))]
    assert dict(gate.calls.items()) == {("single",): 1, ("batch",): 1}
    assert dict(gate.requests.items()) == {(): 10}


def test_a_request_that_failed_alone_fails_its_write_only() -> None:
    fake = _Governance()
    refusal = pb.GateError(code="RESOURCE_EXHAUSTED", reason="RATE_LIMITED",
                           message="agent-3 writes too fast", metadata={"agent_id": "agent-3"})
    refusal.retry_delay.FromMilliseconds(1500)
    fake.item_errors["agent-3"] = refusal
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    answers = _concurrently(gate, fake, 5)
    failed = answers[3]
    assert isinstance(failed, EngramError) and failed.code == "RESOURCE_EXHAUSTED"
    assert failed.reason == "RATE_LIMITED" and "too fast" in failed.message
    # What it would have said alone: a caller told when to retry is told here too.
    assert failed.metadata == {"agent_id": "agent-3"} and failed.retry_delay == 1.5
    assert all(isinstance(a, list) for n, a in enumerate(answers) if n != 3)


def test_no_answer_to_a_batch_fails_every_write_in_it_closed_without_retrying_each() -> None:
    fake = _Governance()
    fake.batch_error = EngramRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    answers = _concurrently(gate, fake, 6)
    assert isinstance(answers[0], list)
    for answer in answers[1:]:
        assert isinstance(answer, Unavailable), answer
        assert answer.reason == "GOVERNANCE_UNAVAILABLE"
        assert "nothing was stored" in answer.message
    assert fake.singles == ["req-0"]  # a governance away is not asked five more times


@pytest.mark.parametrize("code, reason", [
    (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDENTIFIER"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ""),  # the transport's message size, say
])
def test_a_batch_refused_as_a_whole_is_asked_again_by_each_write_in_parallel(
        code: grpc.StatusCode, reason: str) -> None:
    fake = _Governance()
    fake.batch_error = EngramRpcError(code, "requests[2]: bad", reason)
    active, most = [0], [0]
    lock = threading.Lock()
    decide = fake.decide

    def overlapping(*args: object, **kwargs: object) -> pb.DecideWritesResponse:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            if len(fake.singles) >= 1:  # the resends take a while: do they overlap?
                time.sleep(0.2)
            return decide(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with lock:
                active[0] -= 1

    fake.decide = overlapping  # type: ignore[method-assign]
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    answers = _concurrently(gate, fake, 6)
    assert all(isinstance(a, list) for a in answers), answers
    assert sorted(fake.singles) == [f"req-{n}" for n in range(6)]
    assert most[0] > 1, "the writes of a refused batch asked again one after another"


def test_an_overloaded_governance_is_not_asked_once_per_write() -> None:
    fake = _Governance()
    fake.batch_error = EngramRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", "OVERLOADED")
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    answers = _concurrently(gate, fake, 5)
    assert all(isinstance(a, EngramError) and a.reason == "OVERLOADED"
               for a in answers[1:]), answers
    assert fake.singles == ["req-0"]


def test_an_older_governance_gets_single_calls_then_batches_are_tried_again() -> None:
    fake = _Governance()
    fake.batch_error = EngramRpcError(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
    now = [1000.0]
    gate = GovernanceGate(fake, clock=lambda: now[0])  # type: ignore[arg-type]
    answers = _concurrently(gate, fake, 4)
    assert all(isinstance(a, list) for a in answers), answers
    assert len(fake.batches) == 1
    fake.singles.clear()
    for n in range(3):  # straight to single calls, not through the coalescer
        gate.decide("fleet", f"agent-{n}", [_candidate(n)], f"again-{n}", lambda _c: [])
    assert fake.singles == ["again-0", "again-1", "again-2"]
    assert len(fake.batches) == 1, "a batch was sent to a governance that has none"
    now[0] += 61  # governance may have been upgraded: batches are tried again
    fake.batch_error = None
    fake.started.clear()
    fake.release.clear()
    fake.singles.clear()
    answers = _concurrently(gate, fake, 4)
    assert all(isinstance(a, list) for a in answers), answers
    assert len(fake.batches) == 2


def test_a_group_is_sent_in_chunks_governance_takes() -> None:
    fake = _Governance()
    gate = GovernanceGate(fake, max_candidates=4)  # type: ignore[arg-type]
    answers = _concurrently(gate, fake, 10)
    assert all(isinstance(a, list) for a in answers), answers
    assert [len(b) for b in fake.batches] == [4, 4]
    assert fake.singles[0] == "req-0" and len(fake.singles) == 2  # the last one alone


def test_one_fleets_call_in_flight_does_not_hold_back_another_fleets_writes() -> None:
    """Found by review (2026-11-30): one coalescer for every fleet queued fleet B's writes
    behind fleet A's slow call (its deny patterns over large writes), up to the gate's
    timeout. Each fleet now has its own."""
    fake = _Governance()
    gate = GovernanceGate(fake)  # type: ignore[arg-type]
    slow = threading.Thread(target=gate.decide, args=(
        "fleet-a", "agent-a", [_candidate(1)], "req-a", lambda _c: []))
    slow.start()
    try:
        assert fake.started.wait(10)  # fleet A's call is held in flight
        answer = gate.decide("fleet-b", "agent-b", [_candidate(2)], "req-b", lambda _c: [])
        assert [d.decision_id for d in answer] == ["agent-b/req-b/0"]
        assert slow.is_alive()  # B was answered while A's call still waited
    finally:
        fake.release.set()
        slow.join(10)
